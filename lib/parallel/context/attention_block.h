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

// A sliding window over one block (ring attention, model.sliding_window): query i of the block
// attends key j when 0 <= i + offset - j < window, where offset is the position of the block's
// first query minus that of its first key (>= 0: the block's keys are not in the queries' future).
struct Band {
  int64_t offset = 0;
  int64_t window = 1;
};

// How many leading query rows of an Lq x Lk block attend at least one key of the band (the rows
// after them attend none): 0 when the block is wholly outside the window and is skipped.
int64_t band_rows(Band band, int64_t Lq, int64_t Lk);

// attend_block and its backward for the band: q holds only the band_rows(band, ...) leading rows.
// On the CPU the band is an additive mask; on CUDA the flash kernel's window arguments.
BlockAttention attend_band(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Band band);
BlockGradients attend_band_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, Band band);

// The additive mask of a band on an Lq x Lk block (0 where a query attends a key, -inf elsewhere),
// [Lq, Lk] in `options`' dtype and device.
at::Tensor band_mask(Band band, int64_t Lq, int64_t Lk, const at::TensorOptions& options);

// Attention of a block under a boolean mask (document masking, document_mask.h): mask
// [B, 1, Lq, Lk], true where a query attends a key. Rows the mask empties give out 0 and lse -inf
// (they merge as nothing). Written out in ATen operations in the accumulation dtype (fp32; fp64
// for fp64), in which the results and gradients come: the block's scores, Lq x Lk per head, are
// materialised, and the backward's softmax normaliser is the rows' final log-sum-exp, as the
// kernels'. Callers skip blocks the mask empties.
BlockAttention attend_masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask);
BlockGradients attend_masked_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                      const at::Tensor& mask);

// Adds a block's result into running (out, lse) accumulators (fp32 or fp64) for the same rows:
// out = out * e^(lse - new) + part * e^(part_lse - new), new = log(e^lse + e^part_lse); a row
// with lse -inf in both (no key attended yet) stays out 0, lse -inf.
void merge_block(at::Tensor& out, at::Tensor& lse, const BlockAttention& part);

}  // namespace trainer::parallel
