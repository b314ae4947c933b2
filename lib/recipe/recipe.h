#pragma once
// The resolved recipe as typed values: defaults applied, derived fields filled in
// (num_key_value_heads, head_dim, moe_intermediate_size, etp), every rule checked.
// Obtained from load_recipe() (recipe/load.h); torch-free, shared by the runtime and the estimator.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainer::recipe {

struct RopeScaling {
  std::string rope_type = "llama3";
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct MoeConfig {
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 0;
  int64_t num_shared_experts = 0;
  double router_aux_loss_coef = 0.01;
  double router_z_loss_coef = 0.0;        // ST-MoE router z-loss weight; 0: off
  // Routing: "softmax" (Mixtral) or "sigmoid" (DeepSeek-V3) scores; group-limited routing picks
  // topk_group of n_group expert groups per token first; the combine weights are the chosen scores,
  // renormalised over k when norm_topk_prob, times routed_scaling_factor.
  std::string scoring_func = "softmax";
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double bias_update_rate = 0.0;  // auxiliary-loss-free balancing (DeepSeek-V3); 0: off
  std::string aux_loss_scope = "micro_batch";
  std::optional<double> capacity_factor;  // none: dropless
  std::vector<int64_t> layers;            // indices of MoE layers (all when the recipe says null)
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

  bool is_moe_layer(int64_t layer) const;
};

struct ParallelConfig {
  int64_t tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1;
  int64_t dp = -1;  // -1 until a world size is known
  bool sequence_parallel = false;
  int64_t zero = 0;
  std::string pipeline_schedule = "1f1b";
  // Decoder layers per model chunk (pp * vpp entries in model order); empty: a balanced split.
  std::vector<int64_t> pipeline_layout;
  std::string cp_method = "ring";
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
  std::string grad_reduce_dtype = "fp32";  // gradient accumulation and reduction: fp32 or bf16
  double collective_timeout_s = 600.0;
  // "auto" (NCCL on GPUs, Gloo on the CPU), "nccl", or "gloo" (host memory; ranks may share a GPU).
  std::string backend = "auto";
};

// The fused GPU kernels training.fused_kernels can name (model/fused_kernels.h).
inline const std::vector<std::string>& fused_kernel_names() {
  static const std::vector<std::string> names{"rms_norm", "rope", "swiglu", "cross_entropy", "grad_accumulation"};
  return names;
}

struct TrainingConfig {
  int64_t seq_len = 2048;
  int64_t micro_batch_size = 1;
  std::optional<int64_t> global_batch_size;  // none until dp is known when the recipe says null
  int64_t steps = 1000;
  int64_t seed = 1234;
  std::string dtype = "bf16";
  std::string recompute = "none";
  double grad_clip = 1.0;
  // Fused GPU kernels used on CUDA (model/fused_kernels.h); the recipe's default is all of them.
  std::vector<std::string> fused_kernels = fused_kernel_names();
};

struct OptimizerConfig {
  std::string name = "adamw";
  double lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_steps = 0;
  std::string decay = "cosine";
  double beta1 = 0.9, beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

struct DataConfig {
  std::string source = "synthetic";
  std::vector<std::string> paths;
  std::string format = "auto";  // auto, trainer, megatron, llmc
  std::vector<double> weights;  // empty: proportional to dataset sizes
  std::optional<int64_t> loss_mask_token;  // targets equal to this token id are left out of the loss
};

struct EvaluationConfig {
  int64_t interval = 0;              // evaluate every this many steps (and after the last); 0: never
  int64_t steps = 10;                // global batches per evaluation
  std::vector<std::string> paths;    // held-out token datasets; empty: held-out synthetic samples
};

struct CheckpointConfig {
  std::optional<std::string> dir;
  int64_t interval = 0;
  bool async = true;
  int64_t keep = 2;
  std::string resume = "auto";
};

struct LoggingConfig {
  int64_t interval = 1;
  std::optional<std::string> metrics_file;
  std::optional<std::string> tensorboard_dir;  // rank 0 writes TensorBoard event files there; none: off
};

// profiling.steps [first, last] (1-based, inclusive) and the traces' directory; no steps: off.
struct ProfilingConfig {
  std::vector<int64_t> steps;
  std::optional<std::string> dir;
};

struct HardwareConfig {
  std::string gpu = "h100-sxm";
  int64_t gpus_per_node = 8;
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
};

}  // namespace trainer::recipe
