#include "recipe/validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace trainer::recipe {

namespace {

// Divisors of n up to `limit`, as "{1, 2, 4, 8}" for messages.
std::string divisors_text(int64_t n, int64_t limit = 64) {
  std::string text;
  for (int64_t d = 1; d <= std::min(n, limit); ++d)
    if (n % d == 0) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return "{" + text + "}";
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }
int64_t round_down(int64_t value, int64_t multiple) { return value / multiple * multiple; }

// "use 96 or 112" for the nearest multiples of `multiple` around `value`.
std::string nearest_multiples(int64_t value, int64_t multiple) {
  const int64_t below = round_down(value, multiple), above = round_up(value, multiple);
  if (below <= 0 || below == above) return std::to_string(above);
  return fmt::format("{} or {}", below, above);
}

class Checker {
 public:
  explicit Checker(const Recipe& r) : r_(r) {}

  // Sizes beyond any machine (validate.h has the bounds and why), checked before every other rule.
  // Returns false when one is exceeded: the other rules would then compute with absurd values.
  bool size_rules() {
    const auto& m = r_.model;
    const size_t before = problems.size();
    const auto bound = [&](const char* key, int64_t value) {
      if (auto problem = size_bound_problem(key, value)) problems.push_back(*problem);
    };
    bound("model.vocab_size", m.vocab_size);
    bound("model.hidden_size", m.hidden_size);
    bound("model.intermediate_size", m.intermediate_size);
    bound("model.num_hidden_layers", m.num_hidden_layers);
    bound("model.num_nextn_predict_layers", m.num_nextn_predict_layers);
    bound("model.num_attention_heads", m.num_attention_heads);
    bound("model.num_key_value_heads", m.num_key_value_heads);
    bound("model.head_dim", m.head_dim);
    bound("model.max_position_embeddings", m.max_position_embeddings);
    if (m.rope_scaling)
      bound("model.rope_scaling.original_max_position_embeddings", m.rope_scaling->original_max_position_embeddings);
    if (m.moe) {
      bound("model.moe.num_local_experts", m.moe->num_local_experts);
      bound("model.moe.num_shared_experts", m.moe->num_shared_experts);
      bound("model.moe.moe_intermediate_size", m.moe->moe_intermediate_size);
    }
    if (m.mla) {
      if (m.mla->q_lora_rank) bound("model.mla.q_lora_rank", *m.mla->q_lora_rank);
      bound("model.mla.kv_lora_rank", m.mla->kv_lora_rank);
      bound("model.mla.qk_nope_head_dim", m.mla->qk_nope_head_dim);
      bound("model.mla.qk_rope_head_dim", m.mla->qk_rope_head_dim);
      bound("model.mla.v_head_dim", m.mla->v_head_dim);
    }
    if (problems.size() == before && approximate_parameters(m) > kMaxParameters)
      add("the model has about {:.3g} parameters, more than the {:.3g} (2^50) trainer accepts: at 16 bytes per "
          "parameter for weights, gradients and optimizer states they need more memory than 100,000 GPUs of 80 GB "
          "hold; reduce model.hidden_size, model.num_hidden_layers or the experts",
          approximate_parameters(m), kMaxParameters);
    return problems.size() == before;
  }

  void model_rules() {
    const auto& m = r_.model;
    const auto& p = r_.parallel;
    if (!m.mla)  // with MLA head_dim is unused (model.mla's widths)
      if (auto problem = head_dim_problem(m.head_dim)) problems.push_back(*problem);
    if (m.num_attention_heads % m.num_key_value_heads != 0)
      add("model.num_attention_heads={} is not a multiple of model.num_key_value_heads={} (each key/value head "
          "serves a whole group of query heads); use num_key_value_heads in {}",
          m.num_attention_heads, m.num_key_value_heads, divisors_text(m.num_attention_heads));
    if (m.num_attention_heads % p.tp != 0)
      add("model.num_attention_heads={} is not divisible by parallel.tp={} (tensor parallelism splits heads); "
          "use tp in {}",
          m.num_attention_heads, p.tp, divisors_text(m.num_attention_heads));
    if (m.num_key_value_heads % p.tp != 0)
      add("model.num_key_value_heads={} is not divisible by parallel.tp={} (each tp rank needs whole key/value "
          "heads); use tp in {}",
          m.num_key_value_heads, p.tp, divisors_text(m.num_key_value_heads));
    if (m.intermediate_size % p.tp != 0)
      add("model.intermediate_size={} is not divisible by parallel.tp={} (the MLP is split by columns); use tp "
          "in {}",
          m.intermediate_size, p.tp, divisors_text(m.intermediate_size, 16));
    if (m.mla) mla_rules();
    if (m.num_nextn_predict_layers > 0) {
      if (m.num_nextn_predict_layers >= r_.training.seq_len)
        add("model.num_nextn_predict_layers={} leaves no target within training.seq_len={}; use fewer modules",
            m.num_nextn_predict_layers, r_.training.seq_len);
    }
    {
      std::set<int64_t> seen;
      for (auto layer : m.sliding_window_layers) {
        if (layer >= m.num_hidden_layers)
          add("model.sliding_window_layers contains {}, but the model has layers 0..{} (model.num_hidden_layers={})",
              layer, m.num_hidden_layers - 1, m.num_hidden_layers);
        if (!seen.insert(layer).second) add("model.sliding_window_layers lists layer {} twice", layer);
      }
      if (!m.sliding_window && int64_t(m.sliding_window_layers.size()) != m.num_hidden_layers)
        add("model.sliding_window_layers lists {} layers, but model.sliding_window is null (no window); set the "
            "window in tokens or remove the list",
            m.sliding_window_layers.size());
    }
    const int64_t chunks = p.pp * p.vpp;
    if (!p.pipeline_layout.empty()) {
      int64_t sum = 0;
      for (const int64_t n : p.pipeline_layout) sum += n;
      if (int64_t(p.pipeline_layout.size()) != chunks || sum != m.num_hidden_layers)
        add("parallel.pipeline_layout has {} entries summing to {}; expected parallel.pp * parallel.vpp = {} * {} = {} "
            "entries (layers per model chunk) summing to model.num_hidden_layers={}",
            p.pipeline_layout.size(), sum, p.pp, p.vpp, chunks, m.num_hidden_layers);
      else
        for (int64_t c = 1; c + 1 < chunks; ++c)
          if (p.pipeline_layout[size_t(c)] == 0)
            add("parallel.pipeline_layout[{}]=0: a model chunk between the first and the last needs at least one "
                "layer",
                c);
    } else if (m.num_hidden_layers < chunks - 2) {
      add("model.num_hidden_layers={} cannot give each of the {} middle model chunks (parallel.pp * parallel.vpp = "
          "{} * {}) a layer; use fewer chunks",
          m.num_hidden_layers, chunks - 2, p.pp, p.vpp);
    }
    if (r_.training.seq_len > m.max_position_embeddings)
      add("training.seq_len={} exceeds model.max_position_embeddings={}; use seq_len <= {} or raise "
          "max_position_embeddings",
          r_.training.seq_len, m.max_position_embeddings, m.max_position_embeddings);
    if (m.rope_scaling && m.rope_scaling->rope_type == RopeType::Llama3 &&
        m.rope_scaling->low_freq_factor >= m.rope_scaling->high_freq_factor)
      add("model.rope_scaling.low_freq_factor={} must be below model.rope_scaling.high_freq_factor={}",
          m.rope_scaling->low_freq_factor, m.rope_scaling->high_freq_factor);
  }

  // Multi-head latent attention: what it is built with.
  void mla_rules() {
    const auto& m = r_.model;
    const auto& a = *m.mla;
    if (m.attention_bias)
      add("model.attention_bias=true is not built with model.mla (DeepSeek-V3 has none): set it to false");
    if (m.qk_norm) add("model.qk_norm=true is not built with model.mla (its latents have their own norms): set it to false");
    if (m.sliding_window)
      add("model.sliding_window={} is not built with model.mla: set it to null", *m.sliding_window);
    if (a.qk_rope_head_dim % 2 != 0)
      add("model.mla.qk_rope_head_dim={} is odd; the rotary embedding turns pairs of dimensions: use an even width",
          a.qk_rope_head_dim);
    if (a.v_head_dim > a.qk_head_dim())
      add("model.mla.v_head_dim={} exceeds qk_nope_head_dim + qk_rope_head_dim = {} (values are padded to the "
          "query/key width for the attention kernels, never the other way): use v_head_dim <= {}",
          a.v_head_dim, a.qk_head_dim(), a.qk_head_dim());
    if (m.num_key_value_heads != m.num_attention_heads)
      add("model.num_key_value_heads={} with model.mla: latent attention gives every query head its own key and "
          "value; set it to null or to model.num_attention_heads={}",
          m.num_key_value_heads, m.num_attention_heads);
  }

  void moe_rules() {
    const auto& m = r_.model;
    const auto& p = r_.parallel;
    if (!m.moe) {
      if (p.ep > 1)
        add("parallel.ep={} needs a mixture-of-experts model, but model.moe is null; set parallel.ep=1 or add "
            "model.moe",
            p.ep);
      return;
    }
    const auto& e = *m.moe;
    if (e.num_local_experts % p.ep != 0)
      add("model.moe.num_local_experts={} is not divisible by parallel.ep={} (each ep rank holds whole "
          "experts); use ep in {}",
          e.num_local_experts, p.ep, divisors_text(e.num_local_experts, 256));
    if (e.num_local_experts % e.n_group != 0)
      add("model.moe.n_group={} does not divide model.moe.num_local_experts={}; use n_group in {}", e.n_group,
          e.num_local_experts, divisors_text(e.num_local_experts, 256));
    else if (e.n_group > 1 && e.num_local_experts / e.n_group < 2)
      add("model.moe.n_group={} leaves one expert per group, but groups are ranked by their two best experts; use "
          "n_group <= {}", e.n_group, e.num_local_experts / 2);
    else if (e.topk_group > e.n_group)
      add("model.moe.topk_group={} exceeds model.moe.n_group={}; use topk_group <= {}", e.topk_group, e.n_group,
          e.n_group);
    else if (e.n_group > 1 && e.num_experts_per_tok > e.topk_group * (e.num_local_experts / e.n_group))
      add("model.moe.num_experts_per_tok={} exceeds the {} experts of model.moe.topk_group={} groups of {}; raise "
          "topk_group or lower num_experts_per_tok",
          e.num_experts_per_tok, e.topk_group * (e.num_local_experts / e.n_group), e.topk_group,
          e.num_local_experts / e.n_group);
    if (e.num_experts_per_tok > e.num_local_experts)
      add("model.moe.num_experts_per_tok={} exceeds model.moe.num_local_experts={}; use num_experts_per_tok <= {}",
          e.num_experts_per_tok, e.num_local_experts, e.num_local_experts);
    if (e.moe_intermediate_size % p.etp != 0)
      add("model.moe.moe_intermediate_size={} is not divisible by parallel.etp={} (expert MLPs are split by "
          "columns); use etp in {}",
          e.moe_intermediate_size, p.etp, divisors_text(e.moe_intermediate_size, 16));
    if (e.layers.empty())
      add("model.moe.layers is empty; list the MoE layers, use null for all layers, or set model.moe to null");
    std::set<int64_t> seen;
    for (auto layer : e.layers) {
      if (layer >= m.num_hidden_layers)
        add("model.moe.layers contains {}, but the model has layers 0..{} (model.num_hidden_layers={})", layer,
            m.num_hidden_layers - 1, m.num_hidden_layers);
      if (!seen.insert(layer).second) add("model.moe.layers lists layer {} twice", layer);
    }
  }

  void parallel_rules() {
    const auto& p = r_.parallel;
    const auto& m = r_.model;
    const auto& t = r_.training;
    if (p.dp == 0)
      add("parallel.dp=0 is not a data-parallel size; use -1 to derive it from the world size, or a size >= 1");
    if (p.grad_reduce_dtype == Precision::BF16 && t.dtype != Precision::BF16)
      add("parallel.grad_reduce_dtype=\"bf16\" needs training.dtype=\"bf16\" (found \"{}\"); an {} run accumulates "
          "and reduces its gradients in fp32: remove the setting",
          t.dtype, t.dtype);
    if (p.vpp > 1 && !takes_virtual_stages(p.pipeline_schedule))
      add("parallel.vpp={} needs parallel.pipeline_schedule=\"interleaved_1f1b\" (or \"zbv\" with vpp 2), found "
          "\"{}\"; set vpp=1 or use the interleaved schedule",
          p.vpp, p.pipeline_schedule);
    if (p.pipeline_schedule == ScheduleKind::Interleaved1F1B && (p.vpp < 2 || p.pp < 2))
      add("parallel.pipeline_schedule=\"interleaved_1f1b\" needs parallel.pp >= 2 and parallel.vpp >= 2, found "
          "pp={} vpp={}; use pipeline_schedule \"1f1b\" or raise them",
          p.pp, p.vpp);
    if (p.pipeline_schedule == ScheduleKind::ZBV && p.vpp != 2)
      add("parallel.pipeline_schedule=\"zbv\" places two model chunks on each stage in a V, found parallel.vpp={}; "
          "set vpp=2",
          p.vpp);
    if (p.cp > 1) {
      if (t.seq_len % (2 * p.cp) != 0)
        add("training.seq_len={} is not divisible by 2 * parallel.cp = {} (the sequence is split into 2*cp chunks "
            "to balance causal attention); use seq_len {}",
            t.seq_len, 2 * p.cp, nearest_multiples(t.seq_len, 2 * p.cp));
      if (p.cp_method == CpMethod::Ulysses) {
        const int64_t heads = m.num_attention_heads / std::max<int64_t>(1, p.tp);
        const int64_t kv_heads = m.num_key_value_heads / std::max<int64_t>(1, p.tp);
        // Key/value heads need not divide: they are repeated up to lcm(kv, cp) heads, which
        // divides the query heads whenever cp does.
        if (heads % p.cp != 0)
          add("parallel.cp_method=\"ulysses\" splits the query heads across cp ranks, but the {} query heads per tp "
              "rank (model.num_attention_heads={} / parallel.tp={}) are not divisible by parallel.cp={}; use cp in {} "
              "or cp_method \"ring\"",
              heads, m.num_attention_heads, p.tp, p.cp, divisors_text(heads));
        (void)kv_heads;
      }
    }
    if (m.moe && p.tp > 1 && !p.sequence_parallel)
      add("parallel.tp={} with model.moe needs parallel.sequence_parallel=true: without it every tp rank would "
          "route the same tokens to the experts (as Megatron requires); set parallel.sequence_parallel true",
          p.tp);
    if (p.sequence_parallel && p.tp > 1 && (t.seq_len / p.cp) % p.tp != 0)
      add("parallel.sequence_parallel splits each rank's {} tokens (training.seq_len={} / parallel.cp={}) across "
          "parallel.tp={}, which does not divide them; use seq_len {}",
          t.seq_len / p.cp, t.seq_len, p.cp, p.tp, nearest_multiples(t.seq_len, p.cp * p.tp * (p.cp > 1 ? 2 : 1)));
    if (t.global_batch_size && *t.global_batch_size % t.micro_batch_size != 0)
      add("training.global_batch_size={} is not a multiple of training.micro_batch_size={}; use global_batch_size {}",
          *t.global_batch_size, t.micro_batch_size, nearest_multiples(*t.global_batch_size, t.micro_batch_size));
  }

  void world_rules(int64_t world) {
    const auto& p = r_.parallel;
    const auto& t = r_.training;
    const int64_t dense = p.tp * p.cp * p.pp;
    if (world % dense != 0) {
      add("world size {} is not divisible by parallel.tp * cp * pp = {} * {} * {} = {}; use a world size that is a "
          "multiple of {}, or tp, cp and pp whose product divides {}",
          world, p.tp, p.cp, p.pp, dense, dense, world);
      return;
    }
    const int64_t dp = world / dense;
    if (p.dp > 0 && p.dp != dp)
      add("parallel.dp={} does not match world size {} / (tp * cp * pp = {}) = {}; set parallel.dp={} or -1", p.dp,
          world, dense, dp, dp);
    if (r_.model.moe) {
      const int64_t expert = p.etp * p.ep * p.pp;
      if (world % expert != 0)
        add("world size {} is not divisible by parallel.etp * ep * pp = {} * {} * {} = {} (expert layers fold "
            "the same ranks into etp x ep x edp x pp); use ep in {}",
            world, p.etp, p.ep, p.pp, expert, divisors_text(std::gcd(world / (p.etp * p.pp), r_.model.moe->num_local_experts)));
    }
    if (p.dp_shard != -1) {
      const int64_t group = p.tp * p.cp * p.dp_shard;
      if (p.dp_shard < 1 || dp % p.dp_shard != 0)
        add("parallel.dp_shard={} does not divide dp={} (world size {} / (tp * cp * pp)); use dp_shard in {} or -1",
            p.dp_shard, dp, world, divisors_text(dp, 64));
      else if (p.zero < 1)
        add("parallel.dp_shard={} shards ZeRO's states, but parallel.zero=0; set parallel.zero to 1, 2 or 3, or dp_shard -1",
            p.dp_shard);
      else if (group > r_.hardware.gpus_per_node || r_.hardware.gpus_per_node % group != 0)
        add("parallel.dp_shard={}: a shard group spans tp * cp * dp_shard = {} * {} * {} = {} ranks, which do not fit "
            "evenly in a node of hardware.gpus_per_node={}; use dp_shard in {}",
            p.dp_shard, p.tp, p.cp, p.dp_shard, group, r_.hardware.gpus_per_node,
            divisors_text(std::gcd(dp, std::max<int64_t>(1, r_.hardware.gpus_per_node / (p.tp * p.cp))), 64));
    }
    const int64_t per_step = t.micro_batch_size * dp;
    const int64_t global = t.global_batch_size.value_or(per_step);
    if (global % per_step != 0) {
      add("training.global_batch_size={} is not a multiple of training.micro_batch_size * dp = {} * {} = {}; use "
          "global_batch_size {}",
          global, t.micro_batch_size, dp, per_step, nearest_multiples(global, per_step));
      return;
    }
    const int64_t microbatches = global / per_step;
    if (p.pp > 1 && microbatches < p.pp)
      add("parallel.pp={} needs at least {} micro-batches per step to fill the pipeline, but training.global_batch_"
          "size={} / (micro_batch_size {} * dp {}) = {}; use global_batch_size >= {}",
          p.pp, p.pp, global, t.micro_batch_size, dp, microbatches, per_step * p.pp);
  }

  void training_rules() {
    const auto& o = r_.optimizer;
    const auto& t = r_.training;
    if (o.min_lr > o.lr)
      add("optimizer.min_lr={} exceeds optimizer.lr={}; use min_lr <= lr (for example {:.3g})", o.min_lr, o.lr,
          o.lr / 10);
    // A short smoke run of a long recipe: allowed, but the learning rate never reaches its peak.
    if (o.warmup_steps > t.steps)
      warnings.push_back(fmt::format("optimizer.warmup_steps={} exceeds training.steps={}: the whole run is warm-up "
                                     "and the learning rate rises only to {:.3g} of optimizer.lr={:.3g}",
                                     o.warmup_steps, t.steps, double(t.steps) / double(o.warmup_steps), o.lr));
    else if (o.warmup_steps == t.steps && o.warmup_steps > 0 && o.decay != LrDecay::Constant && o.min_lr < o.lr)
      warnings.push_back(fmt::format("optimizer.warmup_steps={} equals training.steps: the run ends at the peak "
                                     "learning rate and never decays toward optimizer.min_lr={:.3g}",
                                     o.warmup_steps, o.min_lr));
  }

  // 8-bit AdamW's blocks of 256 columns (optim/block_grid.h) must not be cut by a tensor-parallel
  // split of a longer row: the row-parallel matrices (o_proj; down_proj, whose experts split by
  // etp). The optimizer refuses the same when it is built (optim/state_layout.cpp), for any matrix.
  void optimizer_rules() {
    const auto& o = r_.optimizer;
    if (o.name != OptimizerName::AdamW8bit) return;
    const auto& m = r_.model;
    const auto& p = r_.parallel;
    const auto check = [&](const std::string& matrix, int64_t columns, int64_t ways, const char* key) {
      if (ways <= 1 || columns <= 256 || columns % ways != 0 || (columns / ways) % 256 == 0) return;
      if (m.hidden_size * columns < o.min_8bit_size) return;  // keeps fp32 moments
      add("optimizer.name=adamw8bit: {} has {} columns, split by parallel.{}={} into {} per rank, which cuts its "
          "8-bit blocks of 256 columns; use a {} that leaves a multiple of 256 columns per rank, or "
          "optimizer.name=adamw",
          matrix, columns, key, ways, columns / ways, key);
    };
    check("o_proj", m.num_attention_heads * (m.mla ? m.mla->v_head_dim : m.head_dim), p.tp, "tp");
    if (!m.moe) check("down_proj", m.intermediate_size, p.tp, "tp");
    if (m.moe) check("the experts' down_proj", m.moe->moe_intermediate_size, p.etp, "etp");
  }

  void profiling_rules() {
    const auto& pr = r_.profiling;
    if (pr.steps.empty()) return;
    const std::string given = fmt::format("[{}]", fmt::join(pr.steps, ", "));
    if (pr.steps.size() != 2 || pr.steps[0] > pr.steps[1])
      add("profiling.steps={} must be [first, last] with first <= last (1-based training steps); for example [{}, {}]",
          given, std::min<int64_t>(2, r_.training.steps), std::min<int64_t>(3, r_.training.steps));
    else if (pr.steps[1] > r_.training.steps)
      add("profiling.steps={} ends after the last step (training.steps={}); use a last step <= {}", given,
          r_.training.steps, r_.training.steps);
    if (!pr.dir)
      add("profiling.steps={} needs profiling.dir, the directory for the traces; set profiling.dir", given);
  }

  void data_rules() {
    const auto& d = r_.data;
    if (d.source == DataSource::Tokens && d.paths.empty())
      add("data.source=\"tokens\" needs data.paths (token dataset prefixes written by scripts/prepare_data)");
    if (d.source == DataSource::Synthetic && !d.paths.empty())
      add("data.paths is set but data.source is \"synthetic\"; set data.source=\"tokens\" to train on those files");
    if (!d.weights.empty() && d.weights.size() != d.paths.size())
      add("data.weights has {} entries but data.paths has {}; give one weight per path", d.weights.size(),
          d.paths.size());
    if (d.loss_mask_token && *d.loss_mask_token >= r_.model.vocab_size)
      add("data.loss_mask_token={} is not a token id of this model (model.vocab_size={}); give an id below it, or "
          "null",
          *d.loss_mask_token, r_.model.vocab_size);
    document_rules();
    const auto& e = r_.evaluation;
    if (e.interval > 0 && e.paths.empty() && d.source == DataSource::Tokens)
      add("evaluation.interval={} with data.source=\"tokens\" needs evaluation.paths (held-out token datasets); "
          "held-out samples without files exist only for synthetic data",
          e.interval);
  }

  // data.document_masking and its keys (data/documents.h).
  void document_rules() {
    const auto& d = r_.data;
    if (d.document_separator_token && *d.document_separator_token >= r_.model.vocab_size)
      add("data.document_separator_token={} is not a token id of this model (model.vocab_size={}); give the id of "
          "the end-of-document token, below it",
          *d.document_separator_token, r_.model.vocab_size);
    if (!d.document_masking) {
      if (d.document_separator_token)
        add("data.document_separator_token={} has no effect without data.document_masking=true; set "
            "data.document_masking=true or remove it",
            *d.document_separator_token);
      if (!d.reset_positions)
        add("data.reset_positions=false has no effect without data.document_masking=true (positions restart "
            "only with it); remove it");
      if (d.document_length_median || d.document_length_p99)
        add("data.document_length_median and data.document_length_p99 describe documents for document masking; "
            "set data.document_masking=true or remove them");
      if (d.balance == DataBalance::Cost)
        add("data.balance=\"cost\" has no effect without data.document_masking=true (every sample costs the "
            "same then); remove it");
      if (d.predict_across_documents)
        add("data.predict_across_documents=true has no effect without data.document_masking=true (every target "
            "is predicted then); remove it");
      return;
    }
    if (bool(d.document_length_median) != bool(d.document_length_p99))
      add("data.document_length_median and data.document_length_p99 go together (a log-normal through both); "
          "give both or neither");
    else if (d.document_length_median && *d.document_length_p99 < *d.document_length_median)
      add("data.document_length_p99={} is below data.document_length_median={}; the 99th percentile is at least "
          "the median",
          *d.document_length_p99, *d.document_length_median);
    if (d.source == DataSource::Synthetic && !d.document_separator_token)
      add("data.document_masking=true with data.source=\"synthetic\" needs data.document_separator_token: "
          "synthetic samples have no document index; name the token that ends a document");
  }

  void checkpoint_rules() {
    const auto& c = r_.checkpoint;
    if (c.interval > 0 && !c.dir)
      add("checkpoint.interval={} needs checkpoint.dir; set a directory or interval 0", c.interval);
    if (c.keep == 1)
      add("checkpoint.keep=1 would delete the last committed checkpoint while the next is being written; use "
          "keep >= 2, or 0 to keep all");
    if (c.resume.mode == ResumeFrom::Mode::Path && c.resume.path.empty())
      add("checkpoint.resume is empty; use \"auto\", \"none\" or a checkpoint path");
    if (c.max_restarts > 0 && !c.dir)
      warnings.push_back(fmt::format("checkpoint.max_restarts={} without checkpoint.dir: every restart starts the run "
                                     "from its beginning; set checkpoint.dir and checkpoint.interval",
                                     c.max_restarts));
    const auto& l = r_.logging;
    if (l.straggler_intervals > 0 && l.straggler_threshold <= 1)
      add("logging.straggler_threshold={} would call every rank slow; use a factor above 1 (default 1.15), or "
          "logging.straggler_intervals=0 to turn straggler attribution off",
          l.straggler_threshold);
  }

  std::vector<std::string> problems;
  std::vector<std::string> warnings;

 private:
  template <typename... Args>
  void add(fmt::format_string<Args...> format, Args&&... args) {
    problems.push_back(fmt::format(format, std::forward<Args>(args)...));
  }

  const Recipe& r_;
};

}  // namespace

std::optional<std::string> size_bound_problem(const std::string& key, int64_t value) {
  static const std::map<std::string, int64_t> bounds = {
      {"model.vocab_size", kMaxVocabSize},
      {"model.hidden_size", kMaxHiddenSize},
      {"model.intermediate_size", kMaxIntermediateSize},
      {"model.num_hidden_layers", kMaxHiddenLayers},
      {"model.num_nextn_predict_layers", kMaxHiddenLayers},
      {"model.num_attention_heads", kMaxHeads},
      {"model.num_key_value_heads", kMaxHeads},
      {"model.head_dim", kMaxHeadDim},
      {"model.max_position_embeddings", kMaxPositions},
      {"model.rope_scaling.original_max_position_embeddings", kMaxPositions},
      {"model.moe.num_local_experts", kMaxExperts},
      {"model.moe.num_shared_experts", kMaxExperts},
      {"model.moe.moe_intermediate_size", kMaxIntermediateSize},
      {"model.mla.q_lora_rank", kMaxHiddenSize},
      {"model.mla.kv_lora_rank", kMaxHiddenSize},
      {"model.mla.qk_nope_head_dim", kMaxHeadDim},
      {"model.mla.qk_rope_head_dim", kMaxHeadDim},
      {"model.mla.v_head_dim", kMaxHeadDim}};
  const auto it = bounds.find(key);
  if (it == bounds.end() || value <= it->second) return std::nullopt;
  return fmt::format("{}={} exceeds the largest size trainer accepts, {} (8x or more the largest published model's; "
                     "a larger value would allocate more than any machine holds); use a value <= {}",
                     key, value, it->second, it->second);
}

std::optional<std::string> head_dim_problem(int64_t head_dim) {
  if (head_dim % 2 == 0) return std::nullopt;
  return fmt::format("model.head_dim={} is odd; rotary position embeddings (RoPE) rotate pairs of dimensions, so each "
                     "head needs an even width (when head_dim is null it is model.hidden_size / "
                     "model.num_attention_heads); use {}",
                     head_dim, head_dim == 1 ? std::string("2") : fmt::format("{} or {}", head_dim - 1, head_dim + 1));
}

double approximate_parameters(const ModelConfig& m) {
  const double hidden = double(m.hidden_size), head_dim = double(m.head_dim);
  const double heads = double(m.num_attention_heads), kv_heads = double(m.num_key_value_heads);
  double attention = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden;
  if (m.mla) {
    const auto& a = *m.mla;
    const double qk = double(a.qk_head_dim()), q_latent = double(a.q_lora_rank.value_or(0));
    attention = (a.q_lora_rank ? hidden * q_latent + q_latent * heads * qk : hidden * heads * qk) +
                hidden * double(a.kv_lora_rank + a.qk_rope_head_dim) +
                double(a.kv_lora_rank) * heads * double(a.qk_nope_head_dim + a.v_head_dim) +
                heads * double(a.v_head_dim) * hidden;
  }
  double moe_layers = 0, expert_mlps = 0;
  if (m.moe) {
    moe_layers = double(m.moe->layers.size());
    const double experts = double(m.moe->num_local_experts) + double(m.moe->num_shared_experts);
    expert_mlps = 3 * hidden * double(m.moe->moe_intermediate_size) * experts + hidden * double(m.moe->num_local_experts);
  }
  const double layers = double(m.num_hidden_layers + m.num_nextn_predict_layers);
  const double dense_layers = std::max(0.0, layers - moe_layers);
  const double embedding = double(m.vocab_size) * hidden * (m.tie_word_embeddings ? 1 : 2);
  return layers * (attention + 2 * hidden) + dense_layers * 3 * hidden * double(m.intermediate_size) +
         moe_layers * expert_mlps + embedding + hidden;
}

std::vector<std::string> validate_recipe(const Recipe& recipe, std::optional<int64_t> world_size,
                                         std::vector<std::string>* warnings) {
  Checker checker(recipe);
  if (!checker.size_rules()) return checker.problems;
  checker.model_rules();
  checker.moe_rules();
  checker.parallel_rules();
  checker.training_rules();
  checker.optimizer_rules();
  checker.data_rules();
  checker.profiling_rules();
  checker.checkpoint_rules();
  if (world_size) checker.world_rules(*world_size);
  if (warnings) warnings->insert(warnings->end(), checker.warnings.begin(), checker.warnings.end());
  return checker.problems;
}

}  // namespace trainer::recipe
