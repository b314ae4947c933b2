#include "model/fused_kernels.h"

namespace trainer::model {

FusedKernels FusedKernels::from(const std::vector<recipe::FusedKernel>& kernels) {
  using K = recipe::FusedKernel;
  FusedKernels k;
  k.rms_norm = recipe::contains(kernels, K::RmsNorm);
  k.rope = recipe::contains(kernels, K::Rope);
  k.swiglu = recipe::contains(kernels, K::Swiglu);
  k.cross_entropy = recipe::contains(kernels, K::CrossEntropy);
  k.grad_accumulation = recipe::contains(kernels, K::GradAccumulation);
  return k;
}

std::vector<recipe::FusedKernel> FusedKernels::list() const {
  using K = recipe::FusedKernel;
  std::vector<K> out;
  for (const auto& [on, kernel] : {std::pair{rms_norm, K::RmsNorm}, std::pair{rope, K::Rope}, std::pair{swiglu, K::Swiglu},
                                   std::pair{cross_entropy, K::CrossEntropy},
                                   std::pair{grad_accumulation, K::GradAccumulation}})
    if (on) out.push_back(kernel);
  return out;
}

bool fusable(const at::Tensor& x) {
  return x.defined() && x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
}

}  // namespace trainer::model
