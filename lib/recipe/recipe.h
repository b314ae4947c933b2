#pragma once
// The resolved recipe as typed values: defaults applied, derived fields filled in
// (num_key_value_heads, head_dim, moe_intermediate_size, topk_group, moe.layers, etp), every rule checked, enum-like keys
// as the enums of choices.h. Obtained from load_recipe() (recipe/load.h); torch-free, shared by the
// runtime and the estimator.
//
// One declaration per key: each section's member (with its default as the initial value) and its
// row in the section's keys() table (JSON name, rules, doc; field.h). Validation's schema, the JSON
// round trip and docs/recipe.md's key tables are made from these tables; adding a key is a member
// and a row here, plus its use.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "recipe/choices.h"
#include "recipe/field.h"

namespace trainer::recipe {

struct RopeScaling {
  RopeType rope_type = RopeType::Llama3;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  // yarn (transformers' _compute_yarn_parameters): the ramp's bounds in rotations, and the factor
  // cos and sin are multiplied by (attention_factor, else from mscale / mscale_all_dim, else
  // 0.1 ln(factor) + 1).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<double> attention_factor;
  bool truncate = true;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("rope_type", &RopeScaling::rope_type, any(),
        "Scaling method: `llama3` (Llama 3.1: long wavelengths divided by `factor`, short ones "
        "kept, a smooth ramp between), `linear` (positions divided by `factor`) or `yarn` (YaRN, "
        "Peng et al. 2023, as transformers computes it: the frequencies between `beta_fast` and "
        "`beta_slow` rotations over the original context ramped from kept to divided by "
        "`factor`, cos and sin scaled by the attention factor).");
    t.key("factor", &RopeScaling::factor, positive(),
        "Context extension factor.");
    t.key("low_freq_factor", &RopeScaling::low_freq_factor, positive(),
        "llama3: low-frequency factor; must be below `model.rope_scaling.high_freq_factor`.");
    t.key("high_freq_factor", &RopeScaling::high_freq_factor, positive(),
        "llama3: high-frequency factor.");
    t.key("original_max_position_embeddings", &RopeScaling::original_max_position_embeddings, at_least(1),
        "llama3 and yarn: context length of the original model.");
    t.key("beta_fast", &RopeScaling::beta_fast, positive(),
        "yarn: rotations over the original context above which a frequency is kept (extrapolated).");
    t.key("beta_slow", &RopeScaling::beta_slow, positive(),
        "yarn: rotations below which a frequency is divided by `factor` (interpolated).");
    t.key("mscale", &RopeScaling::mscale, positive(),
        "yarn: with `mscale_all_dim`, the attention factor is (0.1 mscale ln(factor) + 1) / (0.1 "
        "mscale_all_dim ln(factor) + 1). null: not given.");
    t.key("mscale_all_dim", &RopeScaling::mscale_all_dim, at_least(0),
        "yarn: see `mscale`; with multi-head latent attention (`model.mla`) the softmax scale is "
        "also multiplied by (0.1 mscale_all_dim ln(factor) + 1)^2, as DeepSeek-V3 does. null: not "
        "given.");
    t.key("attention_factor", &RopeScaling::attention_factor, positive(),
        "yarn: the factor cos and sin are multiplied by; null: from `mscale` and `mscale_all_dim` "
        "when both are given, else 0.1 ln(factor) + 1.");
    t.key("truncate", &RopeScaling::truncate, any(),
        "yarn: round the ramp's bounds outwards to whole dimensions (transformers' default).");
  }
};

struct MoeConfig {
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 0;
  int64_t num_shared_experts = 0;
  double router_aux_loss_coef = 0.01;
  double router_z_loss_coef = 0.0;        // ST-MoE router z-loss weight; 0: off
  // Routing: softmax (Mixtral) or sigmoid (DeepSeek-V3) scores; group-limited routing picks
  // topk_group of n_group expert groups per token first; the combine weights are the chosen scores,
  // renormalised over k when norm_topk_prob, times routed_scaling_factor.
  ScoringFunc scoring_func = ScoringFunc::Softmax;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double bias_update_rate = 0.0;  // auxiliary-loss-free balancing (DeepSeek-V3); 0: off
  AuxLossScope aux_loss_scope = AuxLossScope::MicroBatch;
  std::optional<double> capacity_factor;  // none: dropless
  std::vector<int64_t> layers;            // indices of MoE layers (all when the recipe says null)

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("num_local_experts", &MoeConfig::num_local_experts, required().at_least(1),
        "Routed experts per MoE layer.");
    t.key("num_experts_per_tok", &MoeConfig::num_experts_per_tok, at_least(1),
        "Experts each token is routed to (top-k).");
    t.key("moe_intermediate_size", &MoeConfig::moe_intermediate_size, at_least(1).or_same_as("model.intermediate_size"),
        "Width of one expert's SwiGLU MLP; null: `model.intermediate_size`.");
    t.key("num_shared_experts", &MoeConfig::num_shared_experts, at_least(0),
        "Experts every token passes through besides the routed ones (each of width "
        "`moe_intermediate_size`).");
    t.key("router_aux_loss_coef", &MoeConfig::router_aux_loss_coef, at_least(0),
        "Weight of the load-balancing loss N_E * sum_i f_i * p_i (f_i: fraction of tokens routed "
        "to expert i, p_i: mean router probability of expert i).");
    t.key("router_z_loss_coef", &MoeConfig::router_z_loss_coef, at_least(0),
        "Weight of the router z-loss mean(logsumexp(router logits)^2) (ST-MoE), per micro-batch; "
        "0: off. Reported as `z_loss` in the metrics file.");
    t.key("scoring_func", &MoeConfig::scoring_func, any(),
        "Router scores: a softmax over the experts (Mixtral) or a sigmoid per expert "
        "(DeepSeek-V3). With sigmoid, the load-balancing loss uses the scores normalised per "
        "token.");
    t.key("n_group", &MoeConfig::n_group, at_least(1),
        "Group-limited routing (DeepSeek-V3): the experts form `n_group` equal groups (at least 2 "
        "experts each); a token may use the `topk_group` groups whose two best scores sum "
        "highest. 1: none.");
    t.key("topk_group", &MoeConfig::topk_group, at_least(1).or_same_as("model.moe.n_group"),
        "Groups each token may use; null: `n_group` (no limit).");
    t.key("norm_topk_prob", &MoeConfig::norm_topk_prob, any(),
        "Renormalise the chosen experts' scores to sum to 1 before weighting their outputs "
        "(Mixtral, DeepSeek-V3: true; Qwen-MoE: false).");
    t.key("routed_scaling_factor", &MoeConfig::routed_scaling_factor, positive(),
        "Factor on the routed experts' combine weights (DeepSeek-V3: 2.5).");
    t.key("bias_update_rate", &MoeConfig::bias_update_rate, at_least(0),
        "Auxiliary-loss-free load balancing (DeepSeek-V3): each MoE layer keeps a per-expert bias "
        "added to the routing scores for the choice of experts only (not the combine weights); "
        "after every optimizer step each bias moves by `bias_update_rate * sign(mean load - "
        "load)`, the loads counted over the whole step on all ranks. The biases are saved in "
        "checkpoints (manifest `extra.moe_routing_bias`) and resume on any mesh. DeepSeek-V3: "
        "0.001 (with a tiny `router_aux_loss_coef`). 0: off.");
    t.key("aux_loss_scope", &MoeConfig::aux_loss_scope, any(),
        "Where expert frequencies f_i are counted. `micro_batch`: over the micro-batch (summed "
        "over the tp x cp ranks that hold its parts). `global_batch` (Megatron's global-batch "
        "balancing, \"Demons in the Detail\"): over the micro-batches in flight at the same time "
        "on all tp x dp x cp ranks (one time slot), accumulated over the step's slots so far and "
        "reset each step; the loss is then one per slot, averaged over the slots. It therefore "
        "depends on how the global batch is split into micro-batches per rank (dp, "
        "micro_batch_size), not on ep, tp or cp.");
    t.key("capacity_factor", &MoeConfig::capacity_factor, positive(),
        "Each expert takes at most ceil(capacity_factor * tokens * k / experts) token copies, "
        "counted over the whole micro-batch (all tp x cp ranks holding its parts): the copies "
        "with the highest router probability, ties to the earlier token (position, then sample); "
        "the others are dropped (the token keeps its other experts and the residual). The drops "
        "do not depend on the mesh. null: dropless.");
    t.key("layers", &MoeConfig::layers, at_least(0).or_computed(),
        "Indices (0-based) of the layers whose feed-forward is MoE; the others are dense with "
        "`model.intermediate_size`. null: all layers.");
  }
};

// Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank latent, keys
// and values from one shared latent per token, a rotary part of the key shared by all heads.
struct MlaConfig {
  std::optional<int64_t> q_lora_rank;  // null: queries projected directly from the hidden state
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  bool rope_interleave = true;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("q_lora_rank", &MlaConfig::q_lora_rank, at_least(1),
        "Width of the query latent: q_a_proj (hidden -> q_lora_rank), its RMSNorm q_a_layernorm, then "
        "q_b_proj to the heads (DeepSeek-V3: 1536). null: one projection q_proj from the hidden state "
        "(DeepSeek-V2-Lite).");
    t.key("kv_lora_rank", &MlaConfig::kv_lora_rank, at_least(1),
        "Width of the key/value latent: kv_a_proj_with_mqa (hidden -> kv_lora_rank + qk_rope_head_dim), "
        "RMSNorm kv_a_layernorm over the latent, kv_b_proj to each head's key (nope part) and value. The "
        "widths' defaults are DeepSeek-V2's and V3's.");
    t.key("qk_nope_head_dim", &MlaConfig::qk_nope_head_dim, at_least(1),
        "Per-head query/key dimensions without rotary embedding.");
    t.key("qk_rope_head_dim", &MlaConfig::qk_rope_head_dim, at_least(2),
        "Per-head query/key dimensions with rotary embedding (even); the key's are shared by all "
        "heads. The rotary tables are over this width.");
    t.key("v_head_dim", &MlaConfig::v_head_dim, at_least(1),
        "Per-head value width (at most qk_nope_head_dim + qk_rope_head_dim); o_proj reads heads x v_head_dim.");
    t.key("rope_interleave", &MlaConfig::rope_interleave, any(),
        "The rotary dimensions are pairs (x0, x1), (x2, x3), ... as DeepSeek lays them out "
        "(transformers' rope_interleave); false: the two halves (Llama's convention).");
  }
};

struct ModelConfig {
  std::optional<std::string> hf_config;
  std::optional<std::string> init_from;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q, k and v projections with a bias (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of queries and keys before RoPE (Qwen3)
  // Sliding-window attention (Mistral, Qwen2): a query attends to itself and the window - 1 tokens
  // before it, in the layers of sliding_window_layers (all layers when the recipe leaves it null).
  std::optional<int64_t> sliding_window;
  std::vector<int64_t> sliding_window_layers;
  // The embedding and LM head hold padded_vocab_size(tp) rows (Megatron's padding for GEMM shapes);
  // the rows past vocab_size are zeros outside the softmax, never in checkpoints or exports.
  int64_t make_vocab_size_divisible_by = 128;
  int64_t padded_vocab_size(int64_t tp) const {
    const int64_t multiple = make_vocab_size_divisible_by * tp;
    return (vocab_size + multiple - 1) / multiple * multiple;
  }
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.02;
  std::optional<MoeConfig> moe;
  std::optional<MlaConfig> mla;
  // Multi-token prediction (DeepSeek-V3): sequential modules after the last layer, each predicting
  // one token further; their losses weighted by mtp_loss_weight / depth.
  int64_t num_nextn_predict_layers = 0;
  double mtp_loss_weight = 0.3;

  // MoE layers are those of model.moe.layers, and the multi-token prediction blocks (layers
  // num_hidden_layers .. + num_nextn_predict_layers - 1) when the last layer is MoE.
  bool is_moe_layer(int64_t layer) const;
  // The indices of every MoE layer in order: model.moe.layers, then the MoE prediction blocks.
  std::vector<int64_t> routed_layers() const;
  // The attention window of `layer` in tokens (itself included), or 0 for full causal attention;
  // a multi-token prediction block (layer >= num_hidden_layers) has the last layer's.
  int64_t window_of(int64_t layer) const;
  // The width the rotary tables cover: model.mla's qk_rope_head_dim, else head_dim.
  int64_t rotary_dim() const { return mla ? mla->qk_rope_head_dim : head_dim; }
  // The head width the attention core sees: model.mla's qk_nope + qk_rope (values padded to it),
  // else head_dim.
  int64_t attention_head_dim() const { return mla ? mla->qk_head_dim() : head_dim; }
  // With model.mla, the softmax scale's factor over 1/sqrt(qk_head_dim): YaRN's (0.1
  // mscale_all_dim ln(factor) + 1)^2 as DeepSeek applies it (transformers' yarn_apply_mscale), else 1.
  double mla_softmax_factor() const;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("hf_config", &ModelConfig::hf_config, any(),
        "Path of a local Hugging Face `config.json`, or of the directory holding it, to read the "
        "model from; fields given in the recipe override it (relative paths: see "
        "[Paths](#paths)). null: none. See [model.hf_config](#modelhf_config).");
    t.key("init_from", &ModelConfig::init_from, any(),
        "Directory of Hugging Face weights (`model.safetensors`, or "
        "`model.safetensors.index.json` with its shards) to start training from instead of random "
        "initialisation; every parameter must be there with its global shape, and a tensor the "
        "model has no parameter for (another layer count, an untied head) is an error. A "
        "checkpoint to resume from takes precedence (the run says that init_from is ignored). "
        "Export with `trainer ckpt export DIR --hf OUT`.");
    t.key("vocab_size", &ModelConfig::vocab_size, required().at_least(1),
        "Vocabulary size.");
    t.key("hidden_size", &ModelConfig::hidden_size, required().at_least(1),
        "Width of the residual stream.");
    t.key("intermediate_size", &ModelConfig::intermediate_size, required().at_least(1),
        "Width of the dense SwiGLU MLP.");
    t.key("num_hidden_layers", &ModelConfig::num_hidden_layers, required().at_least(1),
        "Number of transformer layers.");
    t.key("num_attention_heads", &ModelConfig::num_attention_heads, required().at_least(1),
        "Query heads.");
    t.key("num_key_value_heads", &ModelConfig::num_key_value_heads, at_least(1).or_same_as("model.num_attention_heads"),
        "Key/value heads (grouped-query attention); null: `model.num_attention_heads` (multi-head "
        "attention).");
    t.key("head_dim", &ModelConfig::head_dim, at_least(1).or_computed(),
        "Width of one head; null: `model.hidden_size / model.num_attention_heads` (which must "
        "divide).");
    t.key("rope_theta", &ModelConfig::rope_theta, positive(),
        "Base of the rotary embedding.");
    t.section("rope_scaling", &ModelConfig::rope_scaling,
        "Rotary frequency scaling as in Hugging Face (Llama 3.1 uses rope_type `llama3`); null: none. "
        "See [model.rope_scaling](#modelrope_scaling).");
    t.key("rms_norm_eps", &ModelConfig::rms_norm_eps, positive(),
        "Epsilon of RMSNorm.");
    t.key("tie_word_embeddings", &ModelConfig::tie_word_embeddings, any(),
        "Share the token embedding with the LM head.");
    t.key("attention_bias", &ModelConfig::attention_bias, any(),
        "A bias on the query, key and value projections (not on the output projection), as in "
        "Qwen2 and Qwen2.5; split with their output features under tensor parallelism.");
    t.key("qk_norm", &ModelConfig::qk_norm, any(),
        "An RMSNorm over each query and key head (weights `q_norm` and `k_norm` of `head_dim`, "
        "shared by the heads) before the rotary embedding, as in Qwen3; its epsilon is "
        "`model.rms_norm_eps`.");
    t.key("sliding_window", &ModelConfig::sliding_window, at_least(1),
        "Sliding-window attention (Mistral, Qwen2 with `use_sliding_window`): each query attends "
        "to itself and the `sliding_window - 1` tokens before it (transformers' rule), on the CPU "
        "through a mask, on CUDA through the flash kernel's window; ring attention skips the key "
        "blocks wholly outside the window. null: full causal attention.");
    t.key("sliding_window_layers", &ModelConfig::sliding_window_layers, at_least(0).or_computed(),
        "Indices (0-based) of the layers that use `model.sliding_window`; the others attend to "
        "the whole causal context (Qwen2's `max_window_layers` k: layers k and above). null: all "
        "layers. Multi-token prediction blocks attend as the last layer.");
    t.key("make_vocab_size_divisible_by", &ModelConfig::make_vocab_size_divisible_by, at_least(1),
        "The embedding and LM head are padded to a multiple of this x `parallel.tp` rows "
        "(Megatron's padding; zero rows outside the softmax, never in checkpoints or exports). 1 "
        "pads only to a multiple of tp.");
    t.key("max_position_embeddings", &ModelConfig::max_position_embeddings, at_least(1),
        "Longest sequence the model is meant for; `training.seq_len` may not exceed it.");
    t.key("initializer_range", &ModelConfig::initializer_range, positive(),
        "Standard deviation of the normal initialisation of weights.");
    t.section("moe", &ModelConfig::moe,
        "Mixture of experts in the feed-forward layers; null: a dense model. See "
        "[model.moe](#modelmoe).");
    t.key("num_nextn_predict_layers", &ModelConfig::num_nextn_predict_layers, at_least(0),
        "Multi-token prediction (DeepSeek-V3): D sequential modules after the last layer; module k "
        "normalises the previous depth's hidden state (the final norm's output for k = 1, the "
        "previous module's `shared_head.norm` output after) and the embedding of the token k ahead "
        "(`enorm`, `hnorm`), projects their concatenation back to the hidden size (`eh_proj`), runs "
        "one decoder layer of the last layer's kind (MoE, window) and predicts the token k + 1 ahead "
        "through its own norm (`shared_head.norm`) and the shared LM head. Parameters "
        "`model.layers.{num_hidden_layers + k - 1}.*` (DeepSeek's names), on the last pipeline "
        "stage. 0: off.");
    t.key("mtp_loss_weight", &ModelConfig::mtp_loss_weight, at_least(0),
        "Weight of the multi-token prediction loss: the objective adds mtp_loss_weight / D times "
        "the sum of the modules' cross-entropies (each over the targets it has, normalised like the "
        "main loss by the step's target count). DeepSeek-V3: 0.3 for the first 10T tokens, then 0.1.");
    t.section("mla", &ModelConfig::mla,
        "Multi-head latent attention (DeepSeek-V2/V3) instead of grouped-query attention; null: "
        "grouped-query attention. `model.head_dim` and `model.num_key_value_heads` are then unused "
        "(every head has its own key and value). See [model.mla](#modelmla).");
  }
};

struct ParallelConfig {
  int64_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1;
  int64_t dp = -1;  // -1 until a world size is known
  bool sequence_parallel = false;
  bool tp_comm_overlap = true;  // with sequence parallelism: collective matmuls
  int64_t zero = 0;
  ScheduleKind pipeline_schedule = ScheduleKind::OneFOneB;
  // Decoder layers per model chunk (pp * vpp entries in model order); empty: a balanced split.
  std::vector<int64_t> pipeline_layout;
  CpMethod cp_method = CpMethod::Ring;
  double grad_bucket_mb = 40.0;
  bool overlap_grad_reduce = true;
  // ZeRO-2/3: accumulate full gradients over micro-batches and reduce-scatter once per step
  // (false: every micro-batch reduce-scatters into the shard). Unset: accumulate_unsharded().
  std::optional<bool> zero_accumulate_unsharded;
  // ZeRO-3: free each layer's gathered parameters after its forward and gather them again for its
  // backward (false: keep them from forward to backward). Unset: reshard_after_forward().
  std::optional<bool> zero3_reshard_after_forward;
  // The settings above with their defaults, which follow the mesh (torchtitan's): under pipeline
  // parallelism ZeRO-3 keeps a stage's parameters and reduces once per step; otherwise it reshards
  // after forward and every micro-batch reduce-scatters.
  bool accumulate_unsharded() const { return zero_accumulate_unsharded.value_or(zero == 3 && pp > 1); }
  bool reshard_after_forward() const { return zero3_reshard_after_forward.value_or(pp == 1); }
  // Hybrid sharding: ZeRO shards dense weights over groups of dp_shard data-parallel ranks (x cp),
  // normally inside a node, and replicates across the groups; -1: over all of dp.
  int64_t dp_shard = -1;
  // ZeRO: parameter all-gathers after the optimizer step overlap the next forward.
  bool overlap_param_gather = true;
  Precision grad_reduce_dtype = Precision::FP32;  // gradient accumulation and reduction
  double collective_timeout_s = 600.0;
  // Auto (NCCL on GPUs, Gloo on the CPU), Nccl, or Gloo (host memory; ranks may share a GPU).
  Backend backend = Backend::Auto;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("tp", &ParallelConfig::tp, at_least(1),
        "Tensor-parallel size (heads, MLP columns and the vocabulary are split); `trainer run` "
        "takes it for dense models ([distributed.md](distributed.md#tensor-parallelism)).");
    t.key("pp", &ParallelConfig::pp, at_least(1),
        "Pipeline-parallel size (stages).");
    t.key("vpp", &ParallelConfig::vpp, at_least(1),
        "Model chunks per pipeline stage (virtual stages); > 1 needs `parallel.pipeline_schedule` "
        "`interleaved_1f1b`, or `zbv` with exactly 2.");
    t.key("cp", &ParallelConfig::cp, at_least(1),
        "Context-parallel size (the sequence is split into 2 x cp chunks, rank r holding chunks r "
        "and 2cp-1-r).");
    t.key("ep", &ParallelConfig::ep, at_least(1),
        "Expert-parallel size (MoE layers; each ep rank holds whole experts).");
    t.key("etp", &ParallelConfig::etp, at_least(1).or_same_as("parallel.tp"),
        "Tensor-parallel size inside experts; null: `parallel.tp`.");
    t.key("dp", &ParallelConfig::dp, at_least(-1),
        "Data-parallel size; -1: world size / (tp x cp x pp) (0 is refused). A positive value "
        "fixes the world size to tp x cp x dp x pp, and `validate` then checks the mesh without "
        "`--world-size`.");
    t.key("sequence_parallel", &ParallelConfig::sequence_parallel, any(),
        "With tp > 1: shard the activations between blocks (residual stream, norms) along the "
        "sequence across tp ranks (reduce-scatter/all-gather instead of all-reduce; norm "
        "gradients summed over tp) ([distributed.md](distributed.md#tensor-parallelism)).");
    t.key("tp_comm_overlap", &ParallelConfig::tp_comm_overlap, any(),
        "With `parallel.sequence_parallel`: the all-gather before each column-parallel GEMM and "
        "the reduce-scatter after each row-parallel GEMM (forward), and the gather of a "
        "row-parallel output's gradient (backward), run as a ring of tp - 1 send/recv steps "
        "pipelined with the GEMM's chunks (collective matmul): chunk i is multiplied while chunk "
        "i + 1 travels. Bit-identical to `false` at tp 2; at larger tp the reduce-scatter adds "
        "in ring order (fp32 rounding). No effect without sequence parallelism "
        "([distributed.md](distributed.md#tensor-parallelism)).");
    t.key("zero", &ParallelConfig::zero, between(0, 3),
        "ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters (gathered "
        "layer by layer where they are used), over the data- and context-parallel ranks (experts "
        "over their edp ranks).");
    t.key("pipeline_schedule", &ParallelConfig::pipeline_schedule, any().one_of(names_of(kTrainingSchedules)),
        "Pipeline schedule ([distributed.md](distributed.md#pipeline-schedules); `trainer "
        "schedule` draws any of them).");
    t.key("pipeline_layout", &ParallelConfig::pipeline_layout, at_least(0).null_is_empty(),
        "Decoder layers of each model chunk in model order (pp x vpp entries summing to "
        "`num_hidden_layers`; chunks between the first and the last need one at least). null: a "
        "balanced split that counts the LM head and loss of the last chunk as extra layers of "
        "work (vocabulary x hidden / one layer's weights; each multi-token prediction module as "
        "one more layer, its eh_proj and one more head).");
    t.key("grad_bucket_mb", &ParallelConfig::grad_bucket_mb, positive(),
        "Size of the data-parallel gradient buckets in MiB; each bucket's reduction starts as "
        "soon as its last gradient is ready during backward.");
    t.key("overlap_grad_reduce", &ParallelConfig::overlap_grad_reduce, any(),
        "Start bucket reductions during backward; `false` starts them all after backward (for "
        "comparison, see `scripts/bench_dp`).");
    t.key("overlap_param_gather", &ParallelConfig::overlap_param_gather, any(),
        "ZeRO 1 and 2: the updated parameters' all-gather runs bucket by bucket behind the next "
        "forward, each bucket waited for just before the first layer that uses it "
        "(`dp_overlap.param_gather_wait_s` in the metrics: the time waited); `false` gathers "
        "everything in the optimizer step (for comparison, see `scripts/bench_zero`). ZeRO-3 "
        "always gathers each unit just before its use with the next one prefetched.");
    t.key("dp_shard", &ParallelConfig::dp_shard, at_least(-1),
        "Hybrid sharding (ZeRO 1, 2 and 3, dense models; HSDP under ZeRO-3): ZeRO shards "
        "optimizer states (ZeRO-2 also gradients, ZeRO-3 also parameters) over groups of "
        "`dp_shard` data-parallel ranks (x cp), normally one node, and replicates across the "
        "groups; each shard's gradients are all-reduced between its replicas, parameters are "
        "gathered inside the group only. The shard group (tp x cp x dp_shard ranks) must divide "
        "`hardware.gpus_per_node`. -1: shard over all of dp. `run` refuses it for MoE models.");
    t.key("zero_accumulate_unsharded", &ParallelConfig::zero_accumulate_unsharded, any(),
        "ZeRO-2 and 3 with gradient accumulation: accumulate full gradients over the "
        "micro-batches and reduce-scatter once per step (less communication, ZeRO-1's gradient "
        "memory during backward); `false`: every micro-batch reduce-scatters into the gradient "
        "shard (least memory). `null`: `true` for ZeRO-3 under pipeline parallelism (torchtitan's "
        "default), `false` otherwise.");
    t.key("zero3_reshard_after_forward", &ParallelConfig::zero3_reshard_after_forward, any(),
        "ZeRO-3: free each unit's (layer's) gathered parameters after its forward and gather them "
        "again, prefetched, for its backward (least memory; FSDP's `reshard_after_forward`); "
        "`false`: keep them from forward to backward (one all-gather less per layer and "
        "micro-batch, a model's worth of parameters at the start of backward). `null`: `true` "
        "without pipeline parallelism; with it `false`, and a stage keeps its units gathered for "
        "all of the step's micro-batches (torchtitan's default).");
    t.key("grad_reduce_dtype", &ParallelConfig::grad_reduce_dtype, any().one_of({"fp32", "bf16"}),
        "Gradients are accumulated over micro-batches and reduced across ranks in this dtype "
        "(Megatron's and torchtitan's default is fp32 for bf16 training); `bf16` (only with "
        "`training.dtype` bf16) halves their memory and traffic at some precision, like "
        "Megatron's `--grad-reduce-in-bf16`.");
    t.key("collective_timeout_s", &ParallelConfig::collective_timeout_s, positive(),
        "A collective or the rendezvous taking longer fails the job with a message naming the "
        "operation, the group and the step.");
    t.key("backend", &ParallelConfig::backend, any(),
        "Communication between ranks. `auto`: NCCL on GPUs (one GPU per local rank; more workers "
        "than GPUs is refused), Gloo on the CPU. `nccl`: the same, refused without a GPU. `gloo`: "
        "Gloo through host memory on GPUs too, CUDA tensors staged through pinned host buffers, "
        "so several ranks may share one GPU (local rank r computes on GPU r mod the GPU count): "
        "for testing every parallel path on a one-GPU machine, not for speed "
        "([distributed.md](distributed.md#several-ranks-on-one-gpu)).");
    t.key("cp_method", &ParallelConfig::cp_method, any(),
        "Context parallelism: ring attention (K/V passed around the cp ranks; on GPUs in bf16 "
        "only, the flash kernel's type) or Ulysses (all-to-all of heads) "
        "([distributed.md](distributed.md#context-parallelism)).");
  }
};

struct TrainingConfig {
  int64_t seq_len = 2048;
  int64_t micro_batch_size = 1;
  std::optional<int64_t> global_batch_size;  // none until dp is known when the recipe says null
  int64_t steps = 1000;
  int64_t seed = 1234;
  Precision dtype = Precision::BF16;
  Recompute recompute = Recompute::None;
  double grad_clip = 1.0;
  // Fused GPU kernels used on CUDA (model/fused_kernels.h), in the order the recipe lists them.
  std::vector<FusedKernel> fused_kernels = all_fused_kernels();

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("seq_len", &TrainingConfig::seq_len, at_least(1),
        "Tokens per sequence.");
    t.key("micro_batch_size", &TrainingConfig::micro_batch_size, at_least(1),
        "Sequences per micro-batch per rank.");
    t.key("global_batch_size", &TrainingConfig::global_batch_size, at_least(1),
        "Sequences per optimizer step over all ranks; null: `micro_batch_size` x dp (no gradient "
        "accumulation). Gradient accumulation steps = global_batch_size / (micro_batch_size x "
        "dp).");
    t.key("steps", &TrainingConfig::steps, at_least(1),
        "Optimizer steps to train for.");
    t.key("seed", &TrainingConfig::seed, at_least(0),
        "Seed of initialisation and data order.");
    t.key("dtype", &TrainingConfig::dtype, any(),
        "Compute precision; bf16 keeps fp32 master weights and optimizer states.");
    t.key("recompute", &TrainingConfig::recompute, any(),
        "Activation recomputation. `none`: nothing recomputed (fastest, most memory). "
        "`core_attention`: the attention core runs again in backward, before o_proj's gradients, "
        "which use its recomputed output (neither the attention output nor its log-sum-exp is "
        "kept). `selective`: the attention core, and lean layers: the norms save only their input "
        "and an rsqrt per row, the linears after a norm compute its output again, the MLP its "
        "activation product (about 40% less activation memory than `none` for Llama shapes, a few "
        "memory-bound kernels more per layer in backward). `full`: whole layers, only each "
        "layer's input kept. The estimator replays each ([estimator.md](estimator.md)).");
    t.key("grad_clip", &TrainingConfig::grad_clip, at_least(0),
        "Clip the global gradient norm to this; 0: off.");
    t.key("fused_kernels", &TrainingConfig::fused_kernels, any().shown_as("all five"),
        "Fused GPU kernels used on CUDA in place of chains of ATen element-wise ops (a CPU run, "
        "and any dtype other than bf16/fp32, uses the unfused ops whatever this says, so CPU "
        "results never depend on it). `rms_norm`: ATen's fused RMSNorm and its backward (saves "
        "the input and an fp32 rstd per row, lean or not; the weight multiplies in fp32, one bf16 "
        "rounding fewer than Hugging Face's order). `rope`: q and k rotated in one launch, "
        "forward and backward (kernels/rope.cu). `swiglu`: silu(gate) * up and its backward in "
        "one pass each, saving gate and up only (kernels/swiglu.cu). `cross_entropy`: the chunked "
        "loss's softmax statistics and logit gradients computed from the bf16 logits, no fp32 "
        "copy of a chunk (kernels/cross_entropy.cu). `grad_accumulation`: weight-gradient GEMMs "
        "add into the fp32 gradient buffer themselves (Megatron's gradient accumulation fusion) "
        "instead of a bf16 product added afterwards. `[]`: the unfused ops everywhere (for "
        "debugging and for measuring each kernel: scripts/bench_gpu --kernels). The estimator "
        "replays what each choice runs.");
  }
};

// Muon (optimizer.name "muon"): the matrices it updates; everything else takes AdamW.
struct MuonConfig {
  double momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;
  MuonScale scale = MuonScale::MatchAdamwRms;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("momentum", &MuonConfig::momentum, between(0, 1),
        "Momentum of the gradient before orthogonalisation.");
    t.key("nesterov", &MuonConfig::nesterov, any(),
        "Nesterov momentum: orthogonalise g + momentum x buffer instead of the buffer.");
    t.key("ns_steps", &MuonConfig::ns_steps, at_least(1),
        "Newton-Schulz iterations (coefficients 3.4445, -4.7750, 2.0315, in fp32 on the whole matrix).");
    t.key("scale", &MuonConfig::scale, any(),
        "`match_adamw_rms`: the update times 0.2 x sqrt(max(rows, cols)) (Moonlight: an update RMS like "
        "AdamW's, so AdamW's lr and weight decay carry over). `spectral`: times sqrt(max(1, rows / cols)).");
  }
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::AdamW;
  Precision state_dtype = Precision::FP32;  // AdamW's moments, Lion's and Muon's momentum
  int64_t min_8bit_size = 4096;
  MuonConfig muon;
  double lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  LrDecay decay = LrDecay::Cosine;
  std::array<double, 2> betas{0.9, 0.95};
  double beta1() const { return betas[0]; }
  double beta2() const { return betas[1]; }
  double eps = 1e-8;
  double weight_decay = 0.1;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("name", &OptimizerConfig::name, any(),
        "`adamw`; `adamw8bit`: AdamW with block-wise 8-bit moments (blocks of 256 columns of each row "
        "of a parameter, an fp32 absmax each, the same blocks on every mesh); `lion`: one "
        "momentum, the update its sign (use betas [0.9, 0.99] and a 3-10x smaller lr than AdamW's); "
        "`muon`: orthogonalised momentum for the 2-D weight matrices of the layers (attention and "
        "feed-forward, each expert's separately, each whole on every mesh), AdamW with the same lr "
        "and betas for embeddings, the LM head, norms, biases and routers. See "
        "[optimizers.md](optimizers.md).");
    t.key("state_dtype", &OptimizerConfig::state_dtype, any(),
        "dtype of the optimizer's state: AdamW's two moments (`adamw`, and the AdamW part of "
        "`muon`), Lion's and Muon's momentum; the master weights stay fp32.");
    t.key("min_8bit_size", &OptimizerConfig::min_8bit_size, at_least(1),
        "`adamw8bit`: parameters with fewer elements than this (norms, biases, small tensors) keep "
        "fp32 moments, as bitsandbytes does.");
    t.section("muon", &OptimizerConfig::muon,
        "Muon's settings (optimizer.name \"muon\"). See [optimizer.muon](#optimizermuon).");
    t.key("lr", &OptimizerConfig::lr, positive(),
        "Peak learning rate.");
    t.key("min_lr", &OptimizerConfig::min_lr, at_least(0),
        "Learning rate at the end of the decay.");
    t.key("warmup_steps", &OptimizerConfig::warmup_steps, at_least(0),
        "Steps of linear warm-up from 0 to lr.");
    t.key("decay", &OptimizerConfig::decay, any(),
        "Decay from lr to min_lr after warm-up.");
    t.key("betas", &OptimizerConfig::betas, between(0, 1),
        "Adam's beta1 and beta2 (Lion: the interpolation of the update and the momentum's decay).");
    t.key("eps", &OptimizerConfig::eps, positive(),
        "Adam's epsilon.");
    t.key("weight_decay", &OptimizerConfig::weight_decay, at_least(0),
        "Decoupled weight decay (not applied to norms and biases).");
  }
};

struct DataConfig {
  DataSource source = DataSource::Synthetic;
  std::vector<std::string> paths;
  DataFormat format = DataFormat::Auto;
  std::vector<double> weights;  // empty: proportional to dataset sizes
  std::optional<int64_t> loss_mask_token;  // targets equal to this token id are left out of the loss
  // Documents (data/documents.h): attention within each document, positions restarting at each.
  bool document_masking = false;
  bool reset_positions = true;            // with document_masking
  bool predict_across_documents = false;  // with document_masking
  std::optional<int64_t> document_separator_token;
  DataBalance balance = DataBalance::Auto;
  // The document-length distribution trainer estimate assumes (estimate/document_work.h).
  std::optional<int64_t> document_length_median, document_length_p99;
  // data.balance resolved: cost with document masking unless "none".
  bool balanced() const {
    return balance == DataBalance::Cost || (balance == DataBalance::Auto && document_masking);
  }

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("source", &DataConfig::source, any(),
        "synthetic: a seeded generator with a known loss floor; tokens: token files. Left out "
        "while `data.paths` is given: `tokens`.");
    t.key("paths", &DataConfig::paths, any(),
        "Token datasets (source `tokens`): a prefix P of P.bin and P.idx (trainer's format, "
        "written by scripts/prepare_data, or Megatron-LM's indexed dataset), one of those two "
        "files, an llm.c shard, or a glob of llm.c shards (one dataset); see [data.md](data.md). "
        "Relative paths: see [Paths](#paths).");
    t.key("format", &DataConfig::format, any(),
        "Format of every `data.paths` entry; auto: detected from the files' magic numbers.");
    t.key("weights", &DataConfig::weights, positive().null_is_empty(),
        "Mixing weights, one per path; null: in proportion to each dataset's size.");
    t.key("loss_mask_token", &DataConfig::loss_mask_token, at_least(0),
        "Targets equal to this token id (padding, an end-of-document token, as Megatron's "
        "`--eod-mask-loss`) are left out of the loss and of the token count it is averaged over; "
        "null: every target counts.");
    t.key("document_masking", &DataConfig::document_masking, any(),
        "Each token attends only to the earlier tokens of its own document (Llama 3's document "
        "masking; Megatron's packed THD sequences, torchtitan's varlen attention). Documents come "
        "from the dataset's document index (trainer's and Megatron's formats) or, when "
        "`data.document_separator_token` is set, end after each separator token. false: a window "
        "attends across documents.");
    t.key("reset_positions", &DataConfig::reset_positions, any(),
        "With `data.document_masking`: rotary positions restart at 0 at each document start "
        "(false: the window's positions 0..seq_len-1).");
    t.key("predict_across_documents", &DataConfig::predict_across_documents, any(),
        "With `data.document_masking`: the last token of a document still predicts the first "
        "token of the next. false: that target is left out of the loss and of the token count.");
    t.key("document_separator_token", &DataConfig::document_separator_token, at_least(0),
        "With `data.document_masking`: the token that ends each document (an end-of-text token; "
        "the token after it starts the next document). Required for data without a document "
        "index (llm.c shards, synthetic data); null: the dataset's document index.");
    t.key("balance", &DataConfig::balance, any(),
        "With `data.document_masking`: which data-parallel rank and which micro-batch processes "
        "each sample of a global batch. cost: chosen by attention work (the sum of the squares of "
        "the sample's document lengths), greedy longest-first, the same on every rank and on a "
        "resume; the global batch's samples, hence the loss, do not change (up to summation "
        "order). none: contiguous, as without masking. auto: cost with masking, else none. See "
        "[data.md](data.md#balanced-packing-databalance).");
    t.key("document_length_median", &DataConfig::document_length_median, at_least(1),
        "With `data.document_masking`, for `trainer estimate` and `trainer plan` only: the median "
        "document length in tokens (`trainer data inspect --lengths` measures it); with "
        "`data.document_length_p99` it describes a log-normal length distribution, from which the "
        "estimator predicts the attention work and the ranks' balance. null: attention counted as "
        "full causal attention.");
    t.key("document_length_p99", &DataConfig::document_length_p99, at_least(1),
        "With `data.document_length_median`: the 99th percentile of the document lengths, tokens.");
  }
};

struct EvaluationConfig {
  int64_t interval = 0;              // evaluate every this many steps (and after the last); 0: never
  int64_t steps = 10;                // global batches per evaluation
  std::vector<std::string> paths;    // held-out token datasets; empty: held-out synthetic samples

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("interval", &EvaluationConfig::interval, at_least(0),
        "Evaluate every this many steps and after the last step (and before a stop on a signal); "
        "0: never.");
    t.key("steps", &EvaluationConfig::steps, at_least(1),
        "Global batches (`training.global_batch_size` sequences each) per evaluation; every "
        "evaluation reads the same held-out samples.");
    t.key("paths", &EvaluationConfig::paths, any(),
        "Held-out token datasets, read in `data.format`; empty: with synthetic data, the "
        "generator's samples from index 2^62 on, which training never reaches. Relative paths: "
        "see [Paths](#paths).");
  }
};

struct CheckpointConfig {
  std::optional<std::string> dir;
  int64_t interval = 0;
  bool async = true;
  int64_t keep = 2;
  ResumeFrom resume;
  int64_t max_restarts = 0;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("dir", &CheckpointConfig::dir, any(),
        "Directory of checkpoints; null: no checkpoints.");
    t.key("interval", &CheckpointConfig::interval, at_least(0),
        "Save every this many steps (and at the end); 0: only at the end.");
    t.key("async", &CheckpointConfig::async, any(),
        "Write in the background; training waits only for the snapshot to host memory, at the "
        "latest before the next optimizer step.");
    t.key("keep", &CheckpointConfig::keep, at_least(0),
        "Keep the newest K committed checkpoints (K >= 2); 0: keep all.");
    t.key("resume", &CheckpointConfig::resume, any(),
        "auto: the latest committed checkpoint in dir, if any; none: start fresh; or a path.");
    t.key("max_restarts", &CheckpointConfig::max_restarts, at_least(0),
        "Under trainer's own launcher (`trainer run --nproc-per-node N`): when a worker dies, "
        "fails or hangs past `parallel.collective_timeout_s`, stop every worker and start them "
        "again from the newest committed checkpoint in `dir`, at most this many times "
        "(`--max-restarts` wins). Never after a recipe error (exit 2) or a diverged run (exit 3). "
        "Under srun or mpirun: scripts/restart_job around the command (scripts/slurm/train.sbatch) "
        "([distributed.md](distributed.md#restarts)).");
  }
};

struct LoggingConfig {
  int64_t interval = 1;
  std::optional<std::string> metrics_file;
  std::optional<std::string> tensorboard_dir;  // rank 0 writes TensorBoard event files there; none: off
  double straggler_threshold = 1.15;  // own time over the others' median that counts as slow
  int64_t straggler_intervals = 3;    // consecutive slow logging intervals before naming a rank; 0: off

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("interval", &LoggingConfig::interval, at_least(1),
        "Print and record metrics every this many steps.");
    t.key("metrics_file", &LoggingConfig::metrics_file, any(),
        "JSONL file of per-step metrics (one object per logged step with at least step, loss, lr, "
        "grad_norm, tokens_per_s, tflops_per_device, mfu, mem_peak_bytes, time_s); null: none.");
    t.key("tensorboard_dir", &LoggingConfig::tensorboard_dir, any(),
        "Directory where rank 0 writes TensorBoard event files: every logged step's loss, "
        "learning rate, gradient norm, throughput, MFU, peak memory, step-time breakdown and MoE "
        "load ([observability.md](observability.md)). Relative paths as for `metrics_file`.");
    t.key("straggler_threshold", &LoggingConfig::straggler_threshold, positive(),
        "A rank whose own time (its step time minus its collective and data waits) exceeds the "
        "median of the other ranks' own times by this factor (with two ranks: the other's) is "
        "slow in that logging interval ([observability.md](observability.md#stragglers)). "
        "Greater than 1.");
    t.key("straggler_intervals", &LoggingConfig::straggler_intervals, at_least(0),
        "Consecutive slow logging intervals after which rank 0 names the rank (a `straggler:` "
        "line and the metrics key `straggler_rank`); 0: no straggler attribution (and no "
        "collective for it).");
  }
};

// profiling.steps [first, last] (1-based, inclusive) and the traces' directory; no steps: off.
struct ProfilingConfig {
  std::vector<int64_t> steps;
  std::optional<std::string> dir;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("steps", &ProfilingConfig::steps, at_least(1).null_is_empty(),
        "Record training steps first..last (1-based, inclusive) with libtorch's profiler (Kineto) "
        "on every rank; null: off.");
    t.key("dir", &ProfilingConfig::dir, any(),
        "Directory of the traces: one Chrome/Perfetto JSON per rank, `trace-rank-NNNNN.json`. "
        "Needed with `profiling.steps`.");
  }
};

struct HardwareConfig {
  std::string gpu = "h100-sxm";  // a GPU profile's name (estimate/hardware.h)
  int64_t gpus_per_node = 8;
  double gpu_mtbf_hours = 50000;  // per GPU, job-interrupting failures of any cause (docs/estimator.md)

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.key("gpu", &HardwareConfig::gpu, any().one_of({"h100-sxm", "h100-pcie", "h200", "a100-80g", "a100-40g", "b200"}),
        "GPU model: a built-in profile of lib/estimate/profiles/ (trainer estimate --gpu-profile "
        "FILE overrides its figures).");
    t.key("gpus_per_node", &HardwareConfig::gpus_per_node, at_least(1),
        "GPUs per node (NVLink domain); mesh groups wider than a node use the network.");
    t.key("gpu_mtbf_hours", &HardwareConfig::gpu_mtbf_hours, positive(),
        "Mean time between job-interrupting failures per GPU (of any cause: GPU, host, network, "
        "software), in hours; a job of N GPUs fails every gpu_mtbf_hours / N hours. Default from "
        "Llama 3's 54-day run: 419 interruptions on 16,384 GPUs, about 50,000 h per GPU. "
        "`trainer estimate` uses it for its checkpoint-interval advice.");
  }
};

struct Recipe {
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  OptimizerConfig optimizer;
  DataConfig data;
  EvaluationConfig evaluation;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  ProfilingConfig profiling;
  HardwareConfig hardware;

  // The keys of this section (field.h).
  template <class Table>
  static void keys(Table& t) {
    t.section("model", &Recipe::model,
        "The network.");
    t.section("parallel", &Recipe::parallel,
        "How the job is split across ranks.");
    t.section("training", &Recipe::training,
        "The optimisation run.");
    t.section("optimizer", &Recipe::optimizer,
        "The optimizer and its learning-rate schedule.");
    t.section("data", &Recipe::data,
        "Where training tokens come from.");
    t.section("evaluation", &Recipe::evaluation,
        "Validation loss on held-out data, forward only.");
    t.section("checkpoint", &Recipe::checkpoint,
        "Saving and resuming.");
    t.section("logging", &Recipe::logging,
        "Console and metrics output (rank 0).");
    t.section("profiling", &Recipe::profiling,
        "Profiler traces of a range of steps.");
    t.section("hardware", &Recipe::hardware,
        "The cluster, for trainer estimate and trainer plan.");
  }
};

}  // namespace trainer::recipe
