#pragma once
// Attention of one block of queries against one block of keys and values, with the row-wise
// log-sum-exp of the scores, and its backward given the final output and log-sum-exp of the rows:
// the pieces ring attention is made of (flash attention's split of softmax across key blocks).
// On the CPU: ATen's flash-attention kernel for the CPU, which returns the log-sum-exp and whose
// backward takes it (the same kernel at::scaled_dot_product_attention runs there); on CUDA ATen's
// flash kernel (bf16 or fp16, head size a multiple of 8 up to 256), whose backward takes the rows'
// final output and log-sum-exp the same way. Shapes:
// q [B, h, Lq, d]; k, v [B, kv, Lk, d] with h a multiple of kv (grouped-query attention: each kv
// head serves h / kv consecutive query heads). `causal`: top-left aligned, for square blocks.
#include <ATen/core/Tensor.h>

namespace trainer::parallel {

struct BlockAttention {
  at::Tensor out;  // [B, h, Lq, d] in q's dtype
  at::Tensor lse;  // [B, h, Lq], fp32 (fp64 for fp64 inputs)
};

BlockAttention attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal);

struct BlockGradients {
  at::Tensor dq;      // [B, h, Lq, d]
  at::Tensor dk, dv;  // [B, kv, Lk, d]
};

// The gradients of this block's share of the attention, where `out` and `lse` are the rows' final
// output and log-sum-exp over all key blocks (so the softmax of this block is recomputed with the
// right normaliser) and `grad_out` the gradient of the final output.
BlockGradients attend_block_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool causal);

// Adds a block's result into running (out, lse) accumulators (fp32 or fp64) for the same rows:
// out = out * e^(lse - new) + part * e^(part_lse - new), new = log(e^lse + e^part_lse).
void merge_block(at::Tensor& out, at::Tensor& lse, const BlockAttention& part);

}  // namespace trainer::parallel
