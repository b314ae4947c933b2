#include "model/moe.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "parallel/expert/all_to_all.h"

namespace trainer::model {

Moe::Moe(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp,
         ExpertParallel ep)
    : ep_(ep),
      num_experts_(config.moe->num_local_experts),
      top_k_(config.moe->num_experts_per_tok),
      capacity_factor_(config.moe->capacity_factor) {
  const auto& moe = *config.moe;
  router_ = Linear(params, prefix + "gate.weight", config.hidden_size, num_experts_, LinearKind::Replicated, tp);
  const size_t before = params.all().size();
  if (num_experts_ % ep.size != 0)
    throw std::logic_error(fmt::format("{} experts do not split over ep = {}", num_experts_, ep.size));
  const int64_t local = num_experts_ / ep.size;
  first_expert_ = ep.rank * local;
  for (int64_t e = first_expert_; e < first_expert_ + local; ++e)
    experts_.emplace_back(params, fmt::format("{}experts.{}.", prefix, e), config.hidden_size,
                          moe.moe_intermediate_size, tp, /*mixtral_names=*/true);
  // Expert weights are reduced over the expert-data-parallel group (MoE folding) and held by this
  // ep rank only.
  for (size_t i = before; i < params.all().size(); ++i) {
    params.all()[i].grad_group = mesh::GroupKind::Edp;
    params.all()[i].expert = ep.size > 1;
  }
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

  // The kept copies in expert order: their tokens and routing weights.
  std::vector<at::Tensor> kept_tokens, kept_weights;
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (lengths[e] == 0) continue;
    kept_tokens.push_back(token_of.narrow(0, starts[e], lengths[e]));
    kept_weights.push_back(weight_of.narrow(0, starts[e], lengths[e]));
  }
  at::Tensor combined = at::zeros_like(tokens);
  if (ep_.size == 1) {
    if (!kept_tokens.empty()) {
      const at::Tensor idx = at::cat(kept_tokens);
      const at::Tensor y = run_local_experts(tokens.index_select(0, idx), lengths) * at::cat(kept_weights).unsqueeze(1);
      combined = combined.index_add(0, idx, y);
    }
  } else {
    const at::Tensor idx = kept_tokens.empty() ? at::zeros({0}, token_of.options()) : at::cat(kept_tokens);
    const at::Tensor weight = kept_weights.empty() ? at::zeros({0}, weight_of.options()) : at::cat(kept_weights);
    const int64_t local = num_experts_ / ep_.size;
    // Counts first: received[s][l] = copies rank s sends to local expert l.
    at::Tensor sent_counts = at::tensor(lengths, at::kLong);
    at::Tensor received_counts = at::empty_like(sent_counts);
    const std::vector<int64_t> per_rank(size_t(ep_.size), local);
    ep_.group->all_to_all(received_counts, sent_counts, per_rank, per_rank)->wait();
    const int64_t* got = received_counts.data_ptr<int64_t>();
    std::vector<int64_t> send_splits(size_t(ep_.size), 0), receive_splits(size_t(ep_.size), 0);
    for (int64_t r = 0; r < ep_.size; ++r)
      for (int64_t l = 0; l < local; ++l) {
        send_splits[size_t(r)] += lengths[size_t(r * local + l)];
        receive_splits[size_t(r)] += got[r * local + l];
      }
    const at::Tensor received =
        parallel::all_to_all_rows(tokens.index_select(0, idx), receive_splits, send_splits, *ep_.group);
    // Arrived in (source rank, local expert) order; the experts want (local expert, source rank).
    std::vector<int64_t> by_expert, local_lengths(size_t(local), 0);
    std::vector<int64_t> source_start(size_t(ep_.size), 0);
    for (int64_t r = 1; r < ep_.size; ++r) source_start[size_t(r)] = source_start[size_t(r - 1)] + receive_splits[size_t(r - 1)];
    for (int64_t l = 0; l < local; ++l)
      for (int64_t r = 0; r < ep_.size; ++r) {
        int64_t offset = source_start[size_t(r)];
        for (int64_t m = 0; m < l; ++m) offset += got[r * local + m];
        for (int64_t i = 0; i < got[r * local + l]; ++i) by_expert.push_back(offset + i);
        local_lengths[size_t(l)] += got[r * local + l];
      }
    const at::Tensor order_by_expert = at::tensor(by_expert, at::kLong).to(tokens.device());
    const at::Tensor y_grouped = run_local_experts(received.index_select(0, order_by_expert), local_lengths);
    // Back to arrival order, then home.
    const at::Tensor back = at::argsort(order_by_expert);
    const at::Tensor y = parallel::all_to_all_rows(y_grouped.index_select(0, back), send_splits, receive_splits,
                                                   *ep_.group);
    combined = combined.index_add(0, idx, y * weight.unsqueeze(1));
  }
  if (shared_) combined = combined + shared_->forward(tokens);
  result.output = combined.view(shape);
  result.tokens_per_expert = at::tensor(lengths, at::kLong);
  return result;
}

at::Tensor Moe::run_local_experts(const at::Tensor& rows, const std::vector<int64_t>& lengths) const {
  // `lengths` holds every expert of the model (ep 1) or the local ones; only local experts run.
  const size_t offset = lengths.size() == experts_.size() ? 0 : size_t(first_expert_);
  std::vector<at::Tensor> outputs;
  int64_t start = 0;
  for (size_t e = 0; e < experts_.size(); ++e) {
    const int64_t n = lengths[offset + e];
    if (n > 0) outputs.push_back(experts_[e].forward(rows.narrow(0, start, n)));
    start += n;
  }
  // No local expert received a row: an empty result still tied to `rows`, so that backward runs
  // the same all-to-alls on every rank (a rank that skipped them would leave the others waiting).
  return outputs.empty() ? rows * 0 : at::cat(outputs);
}

}  // namespace trainer::model
