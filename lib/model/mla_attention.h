#pragma once
// Multi-head latent attention (DeepSeek-V2/V3, model.mla), as transformers' DeepseekV3Attention
// computes it. Queries: q_proj, or q_a_proj -> RMSNorm q_a_layernorm -> q_b_proj. Keys and values:
// kv_a_proj_with_mqa gives a latent of kv_lora_rank (RMSNorm kv_a_layernorm, then kv_b_proj to each
// head's key part without rotary and its value) and one rotary key part of qk_rope_head_dim shared
// by all heads. The core is the same causal attention as Attention's (ring or Ulysses under cp),
// over heads of qk_nope + qk_rope dimensions, the values zero-padded to that width for the kernels.
//
// Tensor parallelism as Megatron's MLA: heads split (q_proj / q_b_proj and kv_b_proj
// column-parallel, o_proj row-parallel); the down-projections and the latent norms are replicated
// on every tp rank, inside the column-parallel region (their input gathered once with sequence
// parallelism), so each rank's latent gradients are partial sums over its heads: the weights'
// gradients are summed over tp (grad_group TpDpCp) and the input gradient once, by the region.
#include <ATen/core/Tensor.h>

#include "model/layers.h"
#include "model/sequence_context.h"
#include "recipe/recipe.h"

namespace trainer::model {

class MlaAttention {
 public:
  MlaAttention() = default;
  MlaAttention(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp,
               ContextParallel cp = {});

  // As Attention::forward: x [T, B, hidden] ([T / tp, B, hidden] with sequence parallelism);
  // seq's rotary tables qk_rope_head_dim wide.
  at::Tensor forward(const at::Tensor& x, const SequenceContext& seq, bool recompute_core,
                     const InputAgain& again = {}) const;

 private:
  Linear q_proj_, q_a_proj_, q_b_proj_, kv_a_proj_, kv_b_proj_, o_proj_;
  RmsNorm q_a_norm_, kv_a_norm_;
  bool q_lora_ = false, interleaved_ = true;
  ContextParallel cp_;
  int64_t local_heads_ = 0, kv_lora_rank_ = 0, nope_ = 0, rope_ = 0, v_dim_ = 0;
  double query_factor_ = 1.0;
};

}  // namespace trainer::model
