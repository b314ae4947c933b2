#pragma once
// Grouped-query causal self-attention through at::scaled_dot_product_attention. Heads are split
// across tensor-parallel ranks (column-parallel q/k/v, row-parallel o_proj); with
// model.attention_bias (Qwen2) q, k and v add a bias split like their output features; with
// model.qk_norm (Qwen3) each query and key head is RMS-normalised before the rotary embedding; with
// model.sliding_window (Mistral) each query attends only the last window tokens. Under context
// parallelism each rank holds its zigzag part of the sequence and the core attention runs over the
// cp group (ring attention or Ulysses, parallel/context/).
#include <ATen/core/Tensor.h>

#include <vector>

#include "model/layers.h"
#include "model/rotary.h"
#include "model/sequence_context.h"
#include "recipe/recipe.h"

namespace trainer::model {

// The causal attention core over this rank's part of the sequence: q [B, h, T, d], k and v
// [B, kv, T, d] -> [B, h, T, d]; ring attention or Ulysses over the cp group when cp.size > 1.
// `window`: sliding window in tokens, 0 for full causal attention.
// `documents` (SequenceContext's, or undefined): keys outside the query's document are masked too.
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp,
                          int64_t window, const at::Tensor& documents = at::Tensor());

class Attention {
 public:
  Attention() = default;
  // fused_rope: q and k rotated by kernels/rope on CUDA (model/fused_kernels.h).
  // `window`: model.sliding_window for this layer (model.sliding_window_layers), 0 for none.
  Attention(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp,
            ContextParallel cp = {}, bool fused_rope = false, int64_t window = 0);

  // x: [T, B, hidden] ([T / tp, B, hidden] with sequence parallelism); seq: the rotary tables
  // (head_dim wide) for the whole sequence and the document mask. `recompute_core`: keep no
  // attention-core activations, recompute them in backward (selective recomputation). `again`: x
  // computed again in backward instead of saved by the q/k/v projections.
  at::Tensor forward(const at::Tensor& x, const SequenceContext& seq, bool recompute_core,
                     const InputAgain& again = {}) const;

  // The attention core alone: q [B, h, T, d], k and v [B, kv, T, d] -> [B, h, T, d] (T: this
  // rank's part of the sequence under context parallelism).
  at::Tensor core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& documents = at::Tensor()) const;

 private:
  Linear q_proj_, k_proj_, v_proj_, o_proj_;
  std::vector<at::Tensor> qkv_bias_;  // q, k and v's local bias slices (model.attention_bias), or empty
  RmsNorm q_norm_, k_norm_;           // model.qk_norm: over head_dim, the weights shared by all heads
  bool qk_norm_ = false;
  TensorParallel tp_;
  ContextParallel cp_;
  int64_t local_heads_ = 0, local_kv_heads_ = 0, head_dim_ = 0;
  bool fused_rope_ = false;
  int64_t window_ = 0;  // sliding window in tokens, 0: full causal attention
};

}  // namespace trainer::model
