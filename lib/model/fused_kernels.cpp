#include "model/fused_kernels.h"

#include <stdexcept>

#include "recipe/recipe.h"

namespace trainer::model {

const std::vector<std::string>& FusedKernels::all_names() { return recipe::fused_kernel_names(); }

FusedKernels FusedKernels::from_names(const std::vector<std::string>& names) {
  FusedKernels k;
  for (const auto& n : names) {
    if (n == "rms_norm") k.rms_norm = true;
    else if (n == "rope") k.rope = true;
    else if (n == "swiglu") k.swiglu = true;
    else if (n == "cross_entropy") k.cross_entropy = true;
    else if (n == "grad_accumulation") k.grad_accumulation = true;
    else throw std::invalid_argument("unknown fused kernel " + n);
  }
  return k;
}

std::vector<std::string> FusedKernels::names() const {
  std::vector<std::string> out;
  for (const auto& [on, name] : std::vector<std::pair<bool, const char*>>{
           {rms_norm, "rms_norm"}, {rope, "rope"}, {swiglu, "swiglu"}, {cross_entropy, "cross_entropy"},
           {grad_accumulation, "grad_accumulation"}})
    if (on) out.emplace_back(name);
  return out;
}

bool fusable(const at::Tensor& x) {
  return x.defined() && x.is_cuda() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat);
}

}  // namespace trainer::model
