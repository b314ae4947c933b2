#pragma once
// Which fused GPU kernels a model uses (recipe training.fused_kernels): each replaces a chain of
// ATen element-wise ops on CUDA tensors of bf16 or fp32 with one pass (kernels/ or ATen's own
// fused op). A CPU run, and any other dtype, computes with the unfused ops whatever this says, so
// CPU results never depend on it.
//   rms_norm           ATen's _fused_rms_norm and its backward (the weight multiplies in fp32: one
//                      bf16 rounding fewer than Hugging Face's order)
//   rope               rotary embedding of q and k in one launch, forward and backward (kernels/rope)
//   swiglu             silu(gate) * up and its backward, one pass each (kernels/swiglu)
//   cross_entropy      the chunked loss's softmax statistics and logit gradients read the bf16
//                      logits directly, no fp32 copy of a chunk (kernels/cross_entropy)
//   grad_accumulation  weight gradients accumulated into the fp32 main_grad by the GEMM itself
//                      (cuBLAS with an fp32 output and beta 1; Megatron's gradient accumulation
//                      fusion) instead of a bf16 product added afterwards
#include <ATen/core/Tensor.h>

#include <vector>

#include "recipe/choices.h"

namespace trainer::model {

struct FusedKernels {
  bool rms_norm = false, rope = false, swiglu = false, cross_entropy = false, grad_accumulation = false;

  // The kernels the recipe lists (training.fused_kernels), and every kernel.
  static FusedKernels from(const std::vector<recipe::FusedKernel>& kernels);
  static FusedKernels all() { return from(recipe::all_fused_kernels()); }
  // The kernels switched on, in recipe/choices.h's order.
  std::vector<recipe::FusedKernel> list() const;
};

// Whether a fused kernel takes `x`: a CUDA tensor of bf16 or fp32.
bool fusable(const at::Tensor& x);

}  // namespace trainer::model
