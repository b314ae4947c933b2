#include "model/moe_routing.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <limits>

namespace trainer::model {

Routing route(const at::Tensor& logits, const RouterOptions& o, const at::Tensor& bias) {
  Routing r;
  const int64_t n = logits.size(0), experts = logits.size(-1), k = o.top_k;
  const at::Tensor fp32 = logits.to(at::kFloat);
  at::Tensor scores;
  if (o.sigmoid) {
    scores = at::sigmoid(fp32);
    r.probs = scores / (scores.sum(-1, /*keepdim=*/true) + 1e-20);
  } else {
    scores = at::softmax(fp32, -1);
    r.probs = scores;
  }
  // The choice: scores (plus the balancing bias) among the token's best groups.
  at::Tensor selection = scores.detach();
  if (bias.defined()) selection = selection + bias.to(selection.device()).unsqueeze(0);
  if (o.n_group > 1 && o.topk_group < o.n_group) {
    const at::Tensor grouped = selection.view({n, o.n_group, experts / o.n_group});
    const at::Tensor group_scores = std::get<0>(grouped.topk(2, -1)).sum(-1);  // [N, groups]
    const at::Tensor best_groups = std::get<1>(group_scores.topk(o.topk_group, -1));
    const at::Tensor allowed = at::zeros_like(group_scores, at::kBool).scatter_(1, best_groups, true);
    selection = selection.masked_fill(~allowed.unsqueeze(-1).expand_as(grouped).reshape({n, experts}),
                                      -std::numeric_limits<float>::infinity());
  }
  // One more than k, for the margin to the first expert left out.
  auto [top, chosen] = selection.topk(std::min(k + 1, experts), -1);
  r.chosen = chosen.narrow(1, 0, k).contiguous();
  r.scores = top.narrow(1, 0, k).contiguous();
  at::Tensor weights = scores.gather(1, r.chosen);
  if (o.normalize) weights = weights / (weights.sum(-1, /*keepdim=*/true) + (o.sigmoid ? 1e-20 : 0.0));
  r.weights = o.scaling == 1.0 ? weights : weights * o.scaling;
  const auto scalar = at::TensorOptions().dtype(at::kFloat).device(logits.device());
  if (k < experts && n > 0)
    r.margin = (top.select(1, k - 1) - top.select(1, k)).min();  // +inf when only masked experts follow
  else
    r.margin = at::full({}, std::numeric_limits<float>::infinity(), scalar);
  return r;
}

at::Tensor capacity_keep(const Routing& routing, const at::Tensor& token_keys, int64_t capacity,
                         int64_t num_experts, comm::Communicator* group) {
  at::NoGradGuard no_grad;
  const int64_t k = routing.chosen.size(1), copies = routing.chosen.numel();
  // One row per copy: score, expert, key (doubles hold all three exactly), gathered in rank order.
  at::Tensor mine = at::stack({routing.scores.reshape({-1}).to(at::kDouble), routing.chosen.reshape({-1}).to(at::kDouble),
                               token_keys.repeat_interleave(k).to(at::kDouble)},
                              1)
                        .contiguous();
  at::Tensor all = mine;
  if (group && group->size() > 1) {
    all = at::empty({copies * group->size(), 3}, mine.options());
    group->all_gather(all, mine)->wait();
  }
  const at::Tensor score = all.select(1, 0), expert = all.select(1, 1).to(at::kLong), key = all.select(1, 2);
  // Order by expert, then score (high first), then key: three stable sorts, least significant first.
  at::Tensor order = std::get<1>(key.sort(/*stable=*/true, 0, false));
  order = order.index_select(0, std::get<1>(score.index_select(0, order).sort(/*stable=*/true, 0, true)));
  order = order.index_select(0, std::get<1>(expert.index_select(0, order).sort(/*stable=*/true, 0, false)));
  const at::Tensor sorted_expert = expert.index_select(0, order);
  const at::Tensor counts = at::bincount(sorted_expert, {}, num_experts);
  const at::Tensor starts = counts.cumsum(0) - counts;
  const at::Tensor rank_in_expert = at::arange(order.size(0), order.options()) - starts.index_select(0, sorted_expert);
  at::Tensor keep = at::empty({order.size(0)}, order.options().dtype(at::kBool));
  keep.index_put_({order}, rank_in_expert < capacity);
  const int64_t me = group ? group->rank() : 0;
  return keep.narrow(0, me * copies, copies);
}

at::Tensor load_balancing_part(const at::Tensor& probs, const at::Tensor& f, int64_t tokens) {
  const int64_t experts = probs.size(1);
  return (f * probs.sum(0) / double(std::max<int64_t>(tokens, 1))).sum() * double(experts);
}

at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& chosen, int64_t num_experts) {
  const int64_t tokens = probs.size(0), k = chosen.size(1);
  const at::Tensor counts = at::bincount(chosen.reshape({-1}), /*weights=*/{}, num_experts).to(at::kFloat);
  return load_balancing_part(probs, counts / double(std::max<int64_t>(tokens * k, 1)), tokens);
}

at::Tensor z_loss_part(const at::Tensor& logits, int64_t tokens) {
  const at::Tensor lse = at::logsumexp(logits.to(at::kFloat), {-1});
  return (lse * lse).sum() / double(std::max<int64_t>(tokens, 1));
}

}  // namespace trainer::model
