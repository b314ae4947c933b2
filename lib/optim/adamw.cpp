#include "optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace trainer::optim {

AdamW::AdamW(std::deque<model::Parameter>& params, const recipe::OptimizerConfig& config)
    : params_(params), config_(config) {
  const bool need_masters = !params.empty() && params.front().tensor.scalar_type() != at::kFloat;
  groups_ = {Group{config.weight_decay, {}}, Group{0.0, {}}};
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].tensor;
    const at::Tensor master = need_masters ? p.detach().to(at::kFloat).clone() : at::Tensor();
    if (need_masters) masters_.push_back(master);
    const at::Tensor like = need_masters ? master : p.detach();
    exp_avgs_.push_back(at::zeros_like(like));
    exp_avg_sqs_.push_back(at::zeros_like(like));
    state_steps_.push_back(at::zeros({}, like.options().dtype(at::kFloat)));
    groups_[params[i].weight_decay ? 0 : 1].members.push_back(i);
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  for (const auto& group : groups_) {
    if (group.members.empty()) continue;
    std::vector<at::Tensor> weights, grads, avgs, avg_sqs, steps;
    int64_t copied_bytes = 0;
    // The fused kernel reads the step counts for bias correction but does not advance them
    // (torch.optim.AdamW increments them first, as here). Each tensor's update is independent, so
    // running the group in slices changes nothing but the size of the fp32 gradient copies that
    // exist at once (bf16 gradients with fp32 master weights): about copy_budget_bytes_.
    const auto run = [&] {
      if (weights.empty()) return;
      at::_foreach_add_(steps, 1.0);
      at::_fused_adamw_(weights, grads, avgs, avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, config_.beta1(),
                        config_.beta2(), group.weight_decay, config_.eps, /*amsgrad=*/false, /*maximize=*/false);
      for (auto* v : {&weights, &grads, &avgs, &avg_sqs, &steps}) v->clear();
      copied_bytes = 0;
    };
    for (size_t i : group.members) {
      const at::Tensor& p = params_[i].tensor;
      const at::Tensor stored = params_[i].grad();
      at::Tensor grad = stored.defined() ? stored : at::zeros_like(p);
      if (!masters_.empty()) {
        const bool copies = grad.scalar_type() != at::kFloat;
        weights.push_back(masters_[i]);
        grads.push_back(grad.to(at::kFloat));
        if (copies) copied_bytes += grad.numel() * 4;
      } else {
        weights.push_back(p);
        grads.push_back(grad);
      }
      avgs.push_back(exp_avgs_[i]);
      avg_sqs.push_back(exp_avg_sqs_[i]);
      steps.push_back(state_steps_[i]);
      if (copied_bytes >= copy_budget_bytes_) run();
    }
    run();
  }
  if (!masters_.empty())
    for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.detach().copy_(masters_[i]);
  ++steps_taken_;
}

void AdamW::zero_grad() {
  for (auto& p : params_) {
    at::Tensor grad = p.grad();
    if (grad.defined()) grad.zero_();
  }
}

void AdamW::refresh_master_weights() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(params_[i].tensor.detach());
}

std::vector<NamedTensor> AdamW::state() {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].name;
    out.push_back({"optimizer.exp_avg." + name, exp_avgs_[i]});
    out.push_back({"optimizer.exp_avg_sq." + name, exp_avg_sqs_[i]});
    out.push_back({"optimizer.step." + name, state_steps_[i]});
    if (!masters_.empty()) out.push_back({"optimizer.master." + name, masters_[i]});
  }
  return out;
}

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
