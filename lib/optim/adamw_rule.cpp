#include "optim/adamw_rule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace trainer::optim {

std::vector<StateSpec> AdamWRule::state_specs(const PieceGeometry&) const {
  const auto dtype = config_.state_dtype == recipe::Precision::BF16 ? at::kBFloat16 : at::kFloat;
  return {{"exp_avg", dtype, false}, {"exp_avg_sq", dtype, false}};
}

void AdamWRule::update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t,
                       const std::vector<at::Tensor>&) {
  at::NoGradGuard no_grad;
  for (const bool decay : {true, false}) {
    std::vector<at::Tensor> weights, grads, avgs, avg_sqs, steps, stored_avgs, stored_avg_sqs;
    for (const Piece& piece : pieces) {
      if (piece.geometry->decay != decay) continue;
      const at::Tensor& m = (*piece.state)[0];
      const at::Tensor& v = (*piece.state)[1];
      weights.push_back(piece.weight);
      grads.push_back(piece.grad.to(at::kFloat));
      // bf16 moments: the kernel works on fp32 copies, rounded back below.
      avgs.push_back(m.scalar_type() == at::kFloat ? m : m.to(at::kFloat));
      avg_sqs.push_back(v.scalar_type() == at::kFloat ? v : v.to(at::kFloat));
      stored_avgs.push_back(m);
      stored_avg_sqs.push_back(v);
      steps.push_back(piece.step);
    }
    if (weights.empty()) continue;
    // The fused kernel reads the step counts for bias correction but does not advance them
    // (torch.optim.AdamW increments them first, as here).
    at::_foreach_add_(steps, 1.0);
    at::_fused_adamw_(weights, grads, avgs, avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, config_.beta1(),
                      config_.beta2(), decay ? weight_decay : 0.0, config_.eps, /*amsgrad=*/false, /*maximize=*/false);
    for (size_t i = 0; i < avgs.size(); ++i) {
      if (!stored_avgs[i].is_same(avgs[i])) stored_avgs[i].copy_(avgs[i]);
      if (!stored_avg_sqs[i].is_same(avg_sqs[i])) stored_avg_sqs[i].copy_(avg_sqs[i]);
    }
  }
}

std::string AdamWRule::describe() const {
  return config_.state_dtype == recipe::Precision::BF16 ? "AdamW (bf16 moments)" : "AdamW";
}

}  // namespace trainer::optim
