#include "optim/lion_rule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace trainer::optim {

std::vector<StateSpec> LionRule::state_specs(const PieceGeometry&) const {
  return {{"momentum", config_.state_dtype == recipe::Precision::BF16 ? at::kBFloat16 : at::kFloat, false}};
}

void LionRule::update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t,
                      const std::vector<at::Tensor>&) {
  at::NoGradGuard no_grad;
  const double b1 = config_.beta1(), b2 = config_.beta2();
  for (const Piece& piece : pieces) {
    const at::Tensor g = piece.grad.to(at::kFloat);
    at::Tensor& stored = (*piece.state)[0];
    const at::Tensor m = stored.to(at::kFloat);
    const at::Tensor direction = at::add(at::mul(m, b1), at::mul(g, 1 - b1)).sign_();
    if (piece.geometry->decay && weight_decay != 0) piece.weight.mul_(1 - lr * weight_decay);
    piece.weight.sub_(at::mul(direction, lr));
    stored.copy_(at::add(at::mul(m, b2), at::mul(g, 1 - b2)));
    piece.step.add_(1.0);
  }
}

std::string LionRule::describe() const {
  return config_.state_dtype == recipe::Precision::BF16 ? "Lion (bf16 momentum)" : "Lion";
}

}  // namespace trainer::optim
