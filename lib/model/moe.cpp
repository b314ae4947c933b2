#include "model/moe.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

namespace trainer::model {

Moe::Moe(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp)
    : num_experts_(config.moe->num_local_experts),
      top_k_(config.moe->num_experts_per_tok),
      capacity_factor_(config.moe->capacity_factor) {
  const auto& moe = *config.moe;
  router_ = Linear(params, prefix + "gate.weight", config.hidden_size, num_experts_, LinearKind::Replicated, tp);
  const size_t before = params.all().size();
  for (int64_t e = 0; e < num_experts_; ++e)
    experts_.emplace_back(params, fmt::format("{}experts.{}.", prefix, e), config.hidden_size,
                          moe.moe_intermediate_size, tp, /*mixtral_names=*/true);
  // Expert weights are reduced over the expert-data-parallel group (MoE folding).
  for (size_t i = before; i < params.all().size(); ++i) params.all()[i].grad_group = mesh::GroupKind::Edp;
  if (moe.num_shared_experts > 0)
    shared_.emplace(params, prefix + "shared_experts.", config.hidden_size,
                    moe.moe_intermediate_size * moe.num_shared_experts, tp);
}

at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& chosen, int64_t num_experts) {
  const int64_t tokens = probs.size(0), k = chosen.size(1);
  const at::Tensor counts = at::bincount(chosen.reshape({-1}), /*weights=*/{}, num_experts).to(at::kFloat);
  const at::Tensor f = counts / double(tokens * k);  // no gradient: a count
  const at::Tensor p = probs.mean(0);
  return (f * p).sum() * double(num_experts);
}

MoeOutput Moe::forward(const at::Tensor& x) const {
  const auto shape = x.sizes().vec();
  const int64_t hidden = x.size(-1);
  const at::Tensor tokens = x.reshape({-1, hidden});
  const int64_t n = tokens.size(0);

  const at::Tensor probs = at::softmax(router_.forward(tokens).to(at::kFloat), -1);  // [N, E]
  auto [top_probs, chosen] = probs.topk(top_k_, -1);                                 // [N, k]
  const at::Tensor weights = (top_probs / top_probs.sum(-1, /*keepdim=*/true)).to(x.scalar_type());

  MoeOutput result;
  result.aux_loss = load_balancing_loss(probs, chosen, num_experts_);

  // Sort the N*k (token, expert) assignments by expert; a stable sort keeps token order.
  const at::Tensor flat_expert = chosen.reshape({-1});
  const at::Tensor order = std::get<1>(flat_expert.sort(/*stable=*/true, 0, false));
  at::Tensor token_of = at::floor_divide(order, top_k_);
  at::Tensor weight_of = weights.reshape({-1}).index_select(0, order);
  at::Tensor counts = at::bincount(flat_expert, {}, num_experts_).cpu();

  std::vector<int64_t> starts(num_experts_), lengths(num_experts_);
  const int64_t* count = counts.data_ptr<int64_t>();
  int64_t start = 0;
  const int64_t capacity = capacity_factor_
                               ? int64_t(std::ceil(*capacity_factor_ * double(n * top_k_) / double(num_experts_)))
                               : std::numeric_limits<int64_t>::max();
  for (int64_t e = 0; e < num_experts_; ++e) {
    starts[e] = start;
    lengths[e] = std::min(count[e], capacity);
    start += count[e];
  }

  std::vector<at::Tensor> outputs, kept_tokens, kept_weights;
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (lengths[e] == 0) continue;
    const at::Tensor idx = token_of.narrow(0, starts[e], lengths[e]);
    outputs.push_back(experts_[e].forward(tokens.index_select(0, idx)));
    kept_tokens.push_back(idx);
    kept_weights.push_back(weight_of.narrow(0, starts[e], lengths[e]));
  }
  at::Tensor combined = at::zeros_like(tokens);
  if (!outputs.empty()) {
    const at::Tensor y = at::cat(outputs) * at::cat(kept_weights).unsqueeze(1);
    combined = combined.index_add(0, at::cat(kept_tokens), y);
  }
  if (shared_) combined = combined + shared_->forward(tokens);
  result.output = combined.view(shape);
  result.tokens_per_expert = at::tensor(lengths, at::kLong);
  return result;
}

}  // namespace trainer::model
