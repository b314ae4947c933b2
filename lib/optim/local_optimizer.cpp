#include "optim/local_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <utility>

#include "optim/state_layout.h"

namespace trainer::optim {

LocalOptimizer::LocalOptimizer(std::deque<model::Parameter>& params, const recipe::OptimizerConfig& config)
    : params_(params), rule_(make_update_rule(config)), weight_decay_(config.weight_decay) {
  const bool need_masters = !params.empty() && params.front().tensor.scalar_type() != at::kFloat;
  for (auto& p : params) {
    if (need_masters) masters_.push_back(p.tensor.detach().to(at::kFloat).clone());
    geometry_.push_back(piece_geometry(p, 0, p.tensor.numel()));
    const auto specs = rule_->state_specs(geometry_.back());
    for (const auto& spec : specs)
      if (spec.per_block) check_block_split(p);
    const at::TensorOptions fp32 = p.tensor.options().dtype(at::kFloat);
    states_.push_back(rule_->make_state(geometry_.back(), fp32));
    steps_.push_back(at::zeros({}, fp32));
  }
}

void LocalOptimizer::step(double lr) {
  at::NoGradGuard no_grad;
  std::vector<Piece> pieces;
  std::vector<at::Tensor> zero_grads;  // parameters without a gradient this step
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].tensor;
    at::Tensor grad = params_[i].grad();
    if (!grad.defined()) grad = zero_grads.emplace_back(at::zeros_like(p));
    if (geometry_[i].length == 0) continue;
    pieces.push_back({masters_.empty() ? p.detach().view({-1}) : masters_[i].view({-1}), grad.reshape({-1}), steps_[i],
                      &states_[i], &geometry_[i]});
  }
  const auto param_of = [&](const Piece& piece) { return size_t(piece.geometry - geometry_.data()); };
  CrossPiece cross;
  if (reduce_maxima_)
    cross.reduce_maxima = [&](std::vector<at::Tensor>& maxima) {
      std::vector<const model::Parameter*> owners;
      for (const Piece& piece : pieces) owners.push_back(&params_[param_of(piece)]);
      reduce_maxima_(owners, maxima);
    };
  if (assemble_matrices_)
    cross.orthogonalize = [&](std::vector<at::Tensor>& inputs, const std::function<void()>& meanwhile) {
      std::vector<at::Tensor> by_parameter(params_.size());
      // Moved, not copied: the assembler lets go of each input once it is sent.
      for (size_t k = 0; k < pieces.size(); ++k) by_parameter[param_of(pieces[k])] = std::move(inputs[k]);
      assemble_matrices_(by_parameter, meanwhile);
      for (size_t k = 0; k < pieces.size(); ++k) inputs[k] = std::move(by_parameter[param_of(pieces[k])]);
    };
  run_update(*rule_, pieces, lr, weight_decay_, steps_taken_ + 1, copy_budget_bytes_, cross);
  if (!masters_.empty())
    for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.detach().copy_(masters_[i]);
  ++steps_taken_;
}

void LocalOptimizer::zero_grad() {
  for (auto& p : params_) {
    at::Tensor grad = p.grad();
    if (grad.defined()) grad.zero_();
  }
}

void LocalOptimizer::refresh_master_weights() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(params_[i].tensor.detach());
}

std::vector<NamedTensor> LocalOptimizer::state() {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const model::Parameter& p = params_[i];
    const auto specs = rule_->state_specs(geometry_[i]);
    for (size_t k = 0; k < specs.size(); ++k) {
      const at::Tensor& s = states_[i][k];
      if (specs[k].per_block)
        out.push_back({"optimizer." + specs[k].name + "." + p.name, s, &p, &geometry_[i]});
      else
        out.push_back({"optimizer." + specs[k].name + "." + p.name, s.view(p.tensor.sizes()), &p, nullptr});
    }
    out.push_back({"optimizer.step." + p.name, steps_[i], &p, nullptr});
    if (!masters_.empty()) out.push_back({"optimizer.master." + p.name, masters_[i], &p, nullptr});
  }
  return out;
}

}  // namespace trainer::optim
