#pragma once
// RMSNorm (Hugging Face Llama's arithmetic: w * (x / sqrt(mean(x^2) + eps)) computed in fp32 at
// least, normalised values cast back to x's dtype before the weight) as one autograd function that
// saves only x in its own dtype and one fp32 reciprocal root per row, instead of the fp32 copy of
// x and the normalised values that autograd keeps. Forward computes exactly what the unfused graph
// does; backward uses the closed form dx = rstd (dy w - xhat mean(dy w xhat)), fewer kernels than
// autograd's chain (equal to it within rounding: about 1e-7 relative in fp32).
#include <ATen/core/Tensor.h>

namespace trainer::model {

// x [..., H], weight [H] (a leaf: its gradient is returned to autograd, which accumulates it).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace trainer::model
