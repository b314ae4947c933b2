#pragma once
// RMSNorm (Hugging Face Llama's arithmetic: w * (x / sqrt(mean(x^2) + eps)) computed in fp32 at
// least, normalised values cast back to x's dtype before the weight) as one autograd function that
// saves only x in its own dtype and one fp32 reciprocal root per row, instead of the fp32 copy of
// x and the normalised values that autograd keeps. Backward replays autograd's kernels in
// autograd's order, so values and gradients are bit-identical to the unfused graph's.
#include <ATen/core/Tensor.h>

namespace trainer::model {

// x [..., H], weight [H] (a leaf: its gradient is returned to autograd, which accumulates it).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace trainer::model
