#include "recipe/schema.h"
#include "core/plural.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/json_file.h"
#include "recipe/recipe.h"

namespace trainer::recipe {

namespace {

using nlohmann::json;
using K = ValueKind;

KeySpec section(std::string path, std::string doc, bool nullable = false) {
  KeySpec s;
  s.path = std::move(path);
  s.kind = K::Section;
  s.nullable = nullable;
  s.default_value = nullable ? json(nullptr) : json::object();
  s.doc = std::move(doc);
  return s;
}

KeySpec key(std::string path, K kind, json default_value, std::string doc) {
  KeySpec s;
  s.path = std::move(path);
  s.kind = kind;
  s.default_value = std::move(default_value);
  s.nullable = s.default_value.is_null();
  s.doc = std::move(doc);
  return s;
}

KeySpec required(std::string path, K kind, std::string doc) {
  KeySpec s = key(std::move(path), kind, nullptr, std::move(doc));
  s.required = true;
  s.nullable = false;
  return s;
}

KeySpec at_least(KeySpec s, double min) {
  s.min = min;
  return s;
}
KeySpec positive(KeySpec s) {
  s.min = 0;
  s.min_exclusive = true;
  return s;
}
KeySpec between(KeySpec s, double min, double max) {
  s.min = min;
  s.max = max;
  return s;
}
KeySpec one_of(KeySpec s, std::vector<std::string> choices) {
  s.choices = std::move(choices);
  return s;
}

std::vector<KeySpec> build_schema() {
  std::vector<KeySpec> s;
  // --- model: Hugging Face config names --------------------------------------------------------
  s.push_back(section("model", "The network. Field names are those of a Hugging Face config.json."));
  s.push_back(key("model.hf_config", K::String, nullptr,
                  "Path of a local Hugging Face config.json (or its directory) to read the model from; "
                  "fields given in the recipe override it. Relative paths are relative to the recipe file."));
  s.push_back(key("model.init_from", K::String, nullptr,
                  "Directory of Hugging Face weights (model.safetensors or an index with shards) to start from "
                  "instead of random initialisation; a checkpoint to resume from takes precedence."));
  s.push_back(at_least(required("model.vocab_size", K::Integer, "Vocabulary size."), 1));
  s.push_back(at_least(required("model.hidden_size", K::Integer, "Width of the residual stream."), 1));
  s.push_back(at_least(required("model.intermediate_size", K::Integer, "Width of the dense SwiGLU MLP."), 1));
  s.push_back(at_least(required("model.num_hidden_layers", K::Integer, "Number of transformer layers."), 1));
  s.push_back(at_least(required("model.num_attention_heads", K::Integer, "Query heads."), 1));
  s.push_back(at_least(key("model.num_key_value_heads", K::Integer, nullptr,
                           "Key/value heads (grouped-query attention); null: num_attention_heads."), 1));
  s.push_back(at_least(key("model.head_dim", K::Integer, nullptr,
                           "Width of one head; null: hidden_size / num_attention_heads."), 1));
  s.push_back(positive(key("model.rope_theta", K::Number, 10000.0, "Base of the rotary embedding.")));
  s.push_back(section("model.rope_scaling",
                      "Rotary frequency scaling as in Hugging Face (Llama 3.1 uses rope_type llama3); null: none.",
                      /*nullable=*/true));
  s.push_back(one_of(key("model.rope_scaling.rope_type", K::String, "llama3", "Scaling method."), {"llama3", "linear"}));
  s.push_back(positive(key("model.rope_scaling.factor", K::Number, 8.0, "Context extension factor.")));
  s.push_back(positive(key("model.rope_scaling.low_freq_factor", K::Number, 1.0, "llama3: low-frequency factor.")));
  s.push_back(positive(key("model.rope_scaling.high_freq_factor", K::Number, 4.0, "llama3: high-frequency factor.")));
  s.push_back(at_least(key("model.rope_scaling.original_max_position_embeddings", K::Integer, 8192,
                           "llama3: context length of the original model."), 1));
  s.push_back(positive(key("model.rms_norm_eps", K::Number, 1e-6, "Epsilon of RMSNorm.")));
  s.push_back(key("model.tie_word_embeddings", K::Boolean, false, "Share the token embedding with the LM head."));
  s.push_back(at_least(key("model.make_vocab_size_divisible_by", K::Integer, 128,
                           "Pad the embedding and LM head to a multiple of this times tp rows (Megatron; zero rows "
                           "outside the softmax, never saved); 1 pads only to a multiple of tp."),
                       1));
  s.push_back(at_least(key("model.max_position_embeddings", K::Integer, 4096,
                           "Longest sequence the model is meant for; training.seq_len may not exceed it."), 1));
  s.push_back(positive(key("model.initializer_range", K::Number, 0.02,
                           "Standard deviation of the normal initialisation of weights.")));
  s.push_back(section("model.moe", "Mixture of experts in the feed-forward layers; null: a dense model.",
                      /*nullable=*/true));
  s.push_back(at_least(required("model.moe.num_local_experts", K::Integer, "Routed experts per MoE layer."), 1));
  s.push_back(at_least(key("model.moe.num_experts_per_tok", K::Integer, 2, "Experts each token is routed to (top-k)."), 1));
  s.push_back(at_least(key("model.moe.moe_intermediate_size", K::Integer, nullptr,
                           "Width of one expert's SwiGLU MLP; null: model.intermediate_size."), 1));
  s.push_back(at_least(key("model.moe.num_shared_experts", K::Integer, 0,
                           "Experts every token passes through besides the routed ones."), 0));
  s.push_back(at_least(key("model.moe.router_aux_loss_coef", K::Number, 0.01,
                           "Weight of the load-balancing loss N_E * sum_i f_i * p_i."), 0));
  s.push_back(at_least(key("model.moe.router_z_loss_coef", K::Number, 0,
                           "Weight of the router z-loss mean(logsumexp(router logits)^2) (ST-MoE); 0: off."), 0));
  s.push_back(one_of(key("model.moe.scoring_func", K::String, "softmax",
                         "Router scores: softmax over the experts (Mixtral) or a sigmoid per expert (DeepSeek-V3)."),
                     {"softmax", "sigmoid"}));
  s.push_back(at_least(key("model.moe.n_group", K::Integer, 1,
                           "Expert groups for group-limited routing (DeepSeek-V3); 1: none."), 1));
  s.push_back(at_least(key("model.moe.topk_group", K::Integer, nullptr,
                           "Groups each token may use (ranked by the sum of their two best scores); null: n_group."), 1));
  s.push_back(key("model.moe.norm_topk_prob", K::Boolean, true,
                  "Renormalise the chosen experts' scores to sum to 1 before weighting their outputs."));
  s.push_back(positive(key("model.moe.routed_scaling_factor", K::Number, 1.0,
                           "Factor on the routed experts' combine weights (DeepSeek-V3: 2.5).")));
  s.push_back(at_least(key("model.moe.bias_update_rate", K::Number, 0,
                           "Auxiliary-loss-free balancing (DeepSeek-V3): after each step every expert's routing "
                           "bias moves by this rate towards balance; 0: off."), 0));
  s.push_back(one_of(key("model.moe.aux_loss_scope", K::String, "micro_batch",
                         "Where expert frequencies f_i are counted: per micro-batch (over the tp x cp ranks "
                         "that share it), or over the micro-batches in flight at once across tp x dp x cp, "
                         "accumulated over the step so far (Megatron's global-batch balancing)."),
                     {"micro_batch", "global_batch"}));
  s.push_back(positive(key("model.moe.capacity_factor", K::Number, nullptr,
                           "Tokens per expert capped at capacity_factor * tokens * k / experts (extra tokens "
                           "dropped); null: dropless.")));
  s.push_back(at_least(key("model.moe.layers", K::IntegerList, nullptr,
                           "Indices of the layers whose feed-forward is MoE; the others are dense. null: all."), 0));

  // --- parallel ----------------------------------------------------------------------------
  s.push_back(section("parallel", "How the job is split across ranks (Megatron rank order tp-cp-ep-dp-pp)."));
  s.push_back(at_least(key("parallel.tp", K::Integer, 1, "Tensor-parallel size."), 1));
  s.push_back(at_least(key("parallel.pp", K::Integer, 1, "Pipeline-parallel size (stages)."), 1));
  s.push_back(at_least(key("parallel.vpp", K::Integer, 1,
                           "Model chunks per pipeline stage (virtual stages); > 1 needs interleaved_1f1b."), 1));
  s.push_back(at_least(key("parallel.cp", K::Integer, 1, "Context-parallel size (the sequence is split)."), 1));
  s.push_back(at_least(key("parallel.ep", K::Integer, 1, "Expert-parallel size (MoE layers)."), 1));
  s.push_back(at_least(key("parallel.etp", K::Integer, nullptr, "Tensor-parallel size inside experts; null: tp."), 1));
  s.push_back(at_least(key("parallel.dp", K::Integer, -1,
                           "Data-parallel size; -1: world size / (tp * cp * pp)."), -1));
  s.push_back(key("parallel.sequence_parallel", K::Boolean, false,
                  "Shard norm and dropout activations along the sequence across tp ranks."));
  s.push_back(between(key("parallel.zero", K::Integer, 0,
                          "ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters, "
                          "over the data- and context-parallel ranks."), 0, 3));
  s.push_back(one_of(key("parallel.pipeline_schedule", K::String, "1f1b",
                         "Pipeline schedule (docs/distributed.md#pipeline-schedules; `trainer schedule` draws it)."),
                     {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv"}));
  s.push_back(at_least(key("parallel.pipeline_layout", K::IntegerList, nullptr,
                           "Decoder layers of each model chunk in model order (pp * vpp entries summing to "
                           "num_hidden_layers); null: a balanced split that counts the LM head and loss as extra "
                           "work."),
                       0));
  s.push_back(positive(key("parallel.grad_bucket_mb", K::Number, 40.0,
                           "Size of the data-parallel gradient buckets in MiB; each bucket's reduction starts as "
                           "soon as its last gradient is ready.")));
  s.push_back(key("parallel.overlap_grad_reduce", K::Boolean, true,
                  "Start bucket reductions during backward (false: all after backward, for comparison)."));
  s.push_back(key("parallel.overlap_param_gather", K::Boolean, true,
                  "ZeRO 1 and 2: the updated parameters' all-gather runs bucket by bucket behind the next forward, "
                  "each bucket waited for just before its first layer (false: all gathered at the optimizer step)."));
  s.push_back(at_least(key("parallel.dp_shard", K::Integer, -1,
                           "Hybrid sharding (ZeRO 1, 2 and 3): shard dense weights' optimizer states and gradients over "
                           "groups of dp_shard data-parallel ranks (times cp), normally one node, and replicate across "
                           "the groups (gradients all-reduced between replicas); -1: shard over all of dp."),
                       -1));
  s.push_back(key("parallel.zero_accumulate_unsharded", K::Boolean, nullptr,
                  "ZeRO-2 and 3 with gradient accumulation: accumulate full gradients over the micro-batches and "
                  "reduce-scatter once per step (less communication, ZeRO-1's gradient memory); false: every "
                  "micro-batch reduce-scatters into the gradient shard (least memory); null: true for ZeRO-3 "
                  "under pipeline parallelism, false otherwise."));
  s.push_back(key("parallel.zero3_reshard_after_forward", K::Boolean, nullptr,
                  "ZeRO-3: free each layer's gathered parameters after its forward and gather them again for its "
                  "backward (least memory); false: keep them from forward to backward (one gather less per "
                  "layer and micro-batch). null: true without pipeline parallelism, false with it (a stage then "
                  "keeps its parameters gathered for all of the step's micro-batches)."));
  s.push_back(one_of(key("parallel.grad_reduce_dtype", K::String, "fp32",
                         "Gradients are accumulated over micro-batches and reduced across ranks in this dtype; bf16 "
                         "(only with training.dtype bf16) halves their memory and traffic at some precision."),
                     {"fp32", "bf16"}));
  s.push_back(positive(key("parallel.collective_timeout_s", K::Number, 600.0,
                           "A collective (or the rendezvous) that takes longer fails the job, naming the operation, "
                           "the group and the step.")));
  s.push_back(one_of(key("parallel.backend", K::String, "auto",
                         "Communication between ranks on GPUs: nccl (one GPU per rank), gloo (through host memory; "
                         "several ranks may share a GPU: for testing, slow), or auto (nccl on GPUs, gloo on the CPU)."),
                     {"auto", "nccl", "gloo"}));
  s.push_back(one_of(key("parallel.cp_method", K::String, "ring",
                         "Context parallelism: ring attention (K/V passed around) or Ulysses (all-to-all of heads)."),
                     {"ring", "ulysses"}));

  // --- training ----------------------------------------------------------------------------
  s.push_back(section("training", "The optimisation run."));
  s.push_back(at_least(key("training.seq_len", K::Integer, 2048, "Tokens per sequence."), 1));
  s.push_back(at_least(key("training.micro_batch_size", K::Integer, 1, "Sequences per micro-batch per rank."), 1));
  s.push_back(at_least(key("training.global_batch_size", K::Integer, nullptr,
                           "Sequences per optimizer step over all ranks; null: micro_batch_size * dp "
                           "(no gradient accumulation)."), 1));
  s.push_back(at_least(key("training.steps", K::Integer, 1000, "Optimizer steps to train for."), 1));
  s.push_back(at_least(key("training.seed", K::Integer, 1234, "Seed of initialisation and data order."), 0));
  s.push_back(one_of(key("training.dtype", K::String, "bf16",
                         "Compute precision; bf16 keeps fp32 master weights and optimizer states."),
                     {"bf16", "fp32"}));
  s.push_back(one_of(key("training.recompute", K::String, "none",
                         "Activation recomputation: none, core_attention (the attention core), selective (the "
                         "attention core and the norms) or full (whole layers)."),
                     {"none", "core_attention", "selective", "full"}));
  s.push_back(at_least(key("training.grad_clip", K::Number, 1.0, "Clip the global gradient norm to this; 0: off."), 0));
  {
    KeySpec fused = key("training.fused_kernels", K::StringList,
                        json(fused_kernel_names()),
                        "Fused GPU kernels used on CUDA in place of chains of element-wise ops: rms_norm (ATen's "
                        "fused RMSNorm), rope (q and k rotated in one launch), swiglu (silu(gate) * up and its "
                        "backward in one pass each), cross_entropy (the loss's softmax statistics and gradients "
                        "from the bf16 logits, no fp32 copy), grad_accumulation (weight-gradient GEMMs accumulate "
                        "into the fp32 gradient directly). [] for ATen's unfused ops; CPU runs use those always.");
    fused.nullable = false;
    fused.choices = fused_kernel_names();
    s.push_back(fused);
  }

  // --- optimizer ---------------------------------------------------------------------------
  s.push_back(section("optimizer", "AdamW and its learning-rate schedule."));
  s.push_back(one_of(key("optimizer.name", K::String, "adamw", "Optimizer."), {"adamw"}));
  s.push_back(positive(key("optimizer.lr", K::Number, 3e-4, "Peak learning rate.")));
  s.push_back(at_least(key("optimizer.min_lr", K::Number, 0.0, "Learning rate at the end of the decay."), 0));
  s.push_back(at_least(key("optimizer.warmup_steps", K::Integer, 0, "Steps of linear warm-up from 0 to lr."), 0));
  s.push_back(one_of(key("optimizer.decay", K::String, "cosine", "Decay from lr to min_lr after warm-up."),
                     {"cosine", "linear", "constant"}));
  {
    KeySpec betas = between(key("optimizer.betas", K::NumberList, json::array({0.9, 0.95}), "Adam's beta1 and beta2."), 0, 1);
    betas.nullable = false;
    betas.list_length = 2;
    s.push_back(betas);
  }
  s.push_back(positive(key("optimizer.eps", K::Number, 1e-8, "Adam's epsilon.")));
  s.push_back(at_least(key("optimizer.weight_decay", K::Number, 0.1,
                           "Decoupled weight decay (not applied to norms and biases)."), 0));

  // --- data --------------------------------------------------------------------------------
  s.push_back(section("data", "Where training tokens come from."));
  s.push_back(one_of(key("data.source", K::String, "synthetic",
                         "synthetic: a seeded generator with a known loss floor; tokens: token files. Left out while "
                         "data.paths is given: tokens."),
                     {"synthetic", "tokens"}));
  {
    KeySpec paths = key("data.paths", K::StringList, json::array(),
                        "Token datasets (source tokens): a prefix P of P.bin and P.idx (trainer's or Megatron-LM's "
                        "format), one of those files, an llm.c shard, or a glob of llm.c shards.");
    paths.nullable = false;
    s.push_back(paths);
  }
  s.push_back(one_of(key("data.format", K::String, "auto",
                         "Format of data.paths: auto (detected from the files' magic numbers), trainer, megatron or "
                         "llmc."),
                     {"auto", "trainer", "megatron", "llmc"}));
  s.push_back(positive(key("data.weights", K::NumberList, nullptr,
                           "Mixing weights, one per path; null: in proportion to each dataset's size.")));
  s.push_back(at_least(key("data.loss_mask_token", K::Integer, nullptr,
                           "Targets equal to this token id (padding, an end-of-document token) are left out of the "
                           "loss and of the token count it is averaged over; null: every target counts."), 0));

  // --- evaluation --------------------------------------------------------------------------
  s.push_back(section("evaluation", "Validation loss on held-out data, forward only."));
  s.push_back(at_least(key("evaluation.interval", K::Integer, 0,
                           "Evaluate every this many steps and after the last step; 0: never."), 0));
  s.push_back(at_least(key("evaluation.steps", K::Integer, 10,
                           "Global batches (training.global_batch_size sequences each) per evaluation."), 1));
  {
    KeySpec paths = key("evaluation.paths", K::StringList, json::array(),
                        "Held-out token datasets, in data.format; empty: with synthetic data, held-out samples of the "
                        "same generator (never used for training).");
    paths.nullable = false;
    s.push_back(paths);
  }

  // --- checkpoint --------------------------------------------------------------------------
  s.push_back(section("checkpoint", "Saving and resuming."));
  s.push_back(key("checkpoint.dir", K::String, nullptr, "Directory of checkpoints; null: no checkpoints."));
  s.push_back(at_least(key("checkpoint.interval", K::Integer, 0,
                           "Save every this many steps (and at the end); 0: only at the end."), 0));
  s.push_back(key("checkpoint.async", K::Boolean, true,
                  "Write in the background; training waits only for the copy to host memory."));
  s.push_back(at_least(key("checkpoint.keep", K::Integer, 2,
                           "Keep the newest K committed checkpoints (K >= 2); 0: keep all."), 0));
  s.push_back(key("checkpoint.resume", K::String, "auto",
                  "auto: the latest committed checkpoint in dir, if any; none: start fresh; or a path."));

  // --- logging -----------------------------------------------------------------------------
  s.push_back(section("logging", "Console and metrics output (rank 0)."));
  s.push_back(at_least(key("logging.interval", K::Integer, 1, "Print and record metrics every this many steps."), 1));
  s.push_back(key("logging.metrics_file", K::String, nullptr, "JSONL file of per-step metrics; null: none."));
  s.push_back(key("logging.tensorboard_dir", K::String, nullptr,
                  "Directory of TensorBoard event files (rank 0 writes the logged steps' scalars); null: none."));

  // --- profiling ---------------------------------------------------------------------------
  s.push_back(section("profiling", "Profiler traces of a range of steps (docs/observability.md)."));
  s.push_back(at_least(key("profiling.steps", K::IntegerList, nullptr,
                           "[first, last]: record training steps first..last (1-based) with libtorch's profiler on "
                           "every rank; null: off."),
                       1));
  s.push_back(key("profiling.dir", K::String, nullptr,
                  "Directory of the traces, one Chrome/Perfetto JSON per rank (trace-rank-NNNNN.json); needed with "
                  "profiling.steps."));

  // --- hardware ----------------------------------------------------------------------------
  s.push_back(section("hardware", "The cluster, for trainer estimate and trainer plan."));
  s.push_back(one_of(key("hardware.gpu", K::String, "h100-sxm",
                         "GPU model: a built-in profile of lib/estimate/profiles/ (trainer estimate --gpu-profile "
                         "FILE overrides its figures)."),
                     {"h100-sxm", "h100-pcie", "h200", "a100-80g", "a100-40g", "b200"}));
  s.push_back(at_least(key("hardware.gpus_per_node", K::Integer, 8,
                           "GPUs per node (NVLink domain); mesh groups wider than a node use the network."), 1));

  // Upper bounds keep every product of sizes (tp*cp*dp*pp, micro_batch*dp, ...) far from int64
  // overflow: parallel sizes up to 4096 (dp up to 2^20), other integers up to 2^40.
  for (auto& spec : s) {
    if (spec.kind != K::Integer && spec.kind != K::IntegerList) continue;
    if (spec.max) continue;
    if (spec.path == "parallel.dp")
      spec.max = double(kMaxDataParallel);
    else if (spec.path.rfind("parallel.", 0) == 0 || spec.path == "hardware.gpus_per_node")
      spec.max = double(kMaxParallelSize);
    else
      spec.max = double(kMaxInteger);
  }
  return s;
}

std::string format_number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<long long>(v));
  return fmt::format("{}", v);
}

std::string bounds_text(const KeySpec& spec) {
  std::string text;
  if (spec.min) text += fmt::format(" {} {}", spec.min_exclusive ? ">" : ">=", format_number(*spec.min));
  if (spec.max) text += fmt::format("{} <= {}", spec.min ? " and" : "", format_number(*spec.max));
  return text;
}

std::string element_problem(const KeySpec& spec, const json& value, bool integer, const std::string& what) {
  if (!value.is_number()) return fmt::format("found {} ({}), expected {}", describe_json(value), json_type_name(value), what);
  if (integer && !value.is_number_integer() && value.get<double>() != std::floor(value.get<double>()))
    return fmt::format("found {}, expected {}", describe_json(value), what);
  const double v = value.get<double>();
  if (!std::isfinite(v)) return fmt::format("found {}, expected a finite number", describe_json(value));
  if (spec.min && (v < *spec.min || (spec.min_exclusive && v == *spec.min)))
    return fmt::format("found {}, expected {}", describe_json(value), what);
  if (spec.max && v > *spec.max) return fmt::format("found {}, expected {}", describe_json(value), what);
  if (integer && std::fabs(v) > 9.0e15) return fmt::format("found {}, which is too large", describe_json(value));
  return "";
}

std::string choice_problem(const KeySpec& spec, const json& value, const std::string& what) {
  if (!value.is_string()) return fmt::format("found {} ({}), expected {}", describe_json(value), json_type_name(value), what);
  if (spec.choices.empty()) return "";
  for (const auto& c : spec.choices)
    if (c == value.get<std::string>()) return "";
  return fmt::format("found {}, expected {}", describe_json(value), what);
}

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = build_schema();
  return table;
}

const KeySpec* find_key(const std::string& path) {
  for (const auto& spec : schema())
    if (spec.path == path) return &spec;
  return nullptr;
}

std::vector<std::string> member_paths(const std::string& section) {
  std::vector<std::string> members;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& spec : schema()) {
    if (spec.path.rfind(prefix, 0) != 0) continue;
    if (spec.path.find('.', prefix.size()) != std::string::npos) continue;
    members.push_back(spec.path);
  }
  return members;
}

std::string describe_expected(const KeySpec& spec) {
  std::string text;
  auto choices = [&] {
    std::string list;
    for (size_t i = 0; i < spec.choices.size(); ++i) list += (i ? ", " : "") + spec.choices[i];
    return list;
  };
  switch (spec.kind) {
    case K::Integer: text = "an integer" + bounds_text(spec); break;
    case K::Number: text = "a number" + bounds_text(spec); break;
    case K::Boolean: text = "true or false"; break;
    case K::String: text = spec.choices.empty() ? "a string" : "one of " + choices(); break;
    case K::IntegerList: text = "a list of integers" + bounds_text(spec); break;
    case K::NumberList: text = "a list of numbers" + bounds_text(spec); break;
    case K::StringList: text = spec.choices.empty() ? "a list of strings" : "a list of: " + choices(); break;
    case K::Section: text = "an object"; break;
  }
  if (spec.list_length) text = fmt::format("{} ({} elements)", text, *spec.list_length);
  if (spec.nullable) text += ", or null";
  return text;
}

std::string check_value(const KeySpec& spec, const json& value) {
  const std::string what = describe_expected(spec);
  if (value.is_null()) return spec.nullable ? "" : fmt::format("found null, expected {}", what);
  auto type_problem = [&] {
    return fmt::format("found {} ({}), expected {}", describe_json(value), json_type_name(value), what);
  };
  switch (spec.kind) {
    case K::Integer: return element_problem(spec, value, true, what);
    case K::Number: return element_problem(spec, value, false, what);
    case K::Boolean: return value.is_boolean() ? "" : type_problem();
    case K::String: return choice_problem(spec, value, what);
    case K::Section: return value.is_object() ? "" : type_problem();
    case K::IntegerList:
    case K::NumberList:
    case K::StringList: {
      if (!value.is_array()) return type_problem();
      if (spec.list_length && value.size() != *spec.list_length)
        return fmt::format("found {}, expected {}", count_of(int64_t(value.size()), "element", "elements"), what);
      for (size_t i = 0; i < value.size(); ++i) {
        std::string problem = spec.kind == K::StringList
                                  ? choice_problem(spec, value[i], what)
                                  : element_problem(spec, value[i], spec.kind == K::IntegerList, what);
        if (!problem.empty()) return fmt::format("element [{}]: {}", i, problem);
      }
      return "";
    }
  }
  return type_problem();
}

}  // namespace trainer::recipe
