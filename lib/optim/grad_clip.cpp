#include "optim/grad_clip.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace trainer::optim {

at::Tensor global_grad_norm(const std::deque<model::Parameter>& params) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return at::zeros({}, at::kFloat);
  std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2, at::kFloat);
  return at::stack(norms).norm();
}

double clip_coefficient(double max_norm, double norm) {
  return max_norm <= 0 || norm <= max_norm ? 1.0 : max_norm / (norm + 1e-6);
}

double clip_gradients(std::deque<model::Parameter>& params, double max_norm, double norm) {
  const double coefficient = clip_coefficient(max_norm, norm);
  if (coefficient == 1.0) return 1.0;
  at::NoGradGuard no_grad;
  for (auto& p : params)
    if (p.grad().defined()) p.grad().mul_(coefficient);
  return coefficient;
}

}  // namespace trainer::optim
