#pragma once
// The torch side of the fused GPU kernels (model/fused_kernels.h says when each is used): autograd
// functions and plain calls over kernels/ and ATen's fused RMSNorm. Every function here requires
// fusable() inputs (CUDA, bf16 or fp32) and throws std::logic_error otherwise; callers choose the
// unfused ops for anything else.
#include <ATen/core/Tensor.h>

#include <utility>

namespace trainer::model::fused {

// RMSNorm through ATen's _fused_rms_norm (CUDA) as an autograd function saving x, the weight and
// the fp32 reciprocal root per row: w * x / sqrt(mean(x^2) + eps) over the last dimension.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary embedding of q [T, B, hq, D] and k [T, B, hk, D] (heads' D values contiguous) with cos
// and sin [T, D]: both rotated in one launch, forward and backward; outputs contiguous.
std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                       const at::Tensor& sin);

// silu(gate) * up as an autograd function saving gate and up.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);
// The same product and its backward without autograd (for functions that save gate and up
// themselves): returns (grad_gate, grad_up).
at::Tensor swiglu_product(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up);

// The softmax statistics of logits [rows, cols] (model dtype, row stride free): fp32 row maximum,
// sum of exp(logit - maximum) and the logit at `column` (int64 [rows]; -1: none, giving 0).
struct RowStats {
  at::Tensor max, sum_exp, target_logit;
};
RowStats cross_entropy_row_stats(const at::Tensor& logits, const at::Tensor& column);

// logits [rows, cols] (contiguous) turned in place into (softmax(logit - lse) - one_hot(column)) *
// coef per row: lse and coef fp32 [rows], column int64 [rows] (-1: no one-hot).
void cross_entropy_logit_grad_(at::Tensor& logits, const at::Tensor& lse, const at::Tensor& column,
                               const at::Tensor& coef);

// out (fp32) += a.mm(b) for a, b in bf16 on CUDA, the product accumulated by the GEMM in fp32
// (cuBLAS beta 1), never rounded to bf16.
void add_mm_(at::Tensor& out, const at::Tensor& a, const at::Tensor& b);

}  // namespace trainer::model::fused
