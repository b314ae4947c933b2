#include "model/moe.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "model/recompute.h"

namespace trainer::model {

void MoeStepState::reset() {
  tokens_per_expert = at::Tensor();
  min_margin = at::Tensor();
  z_loss = at::Tensor();
  batch_counts = at::Tensor();
  batch_slots = 0;
  replay.clear();
}

Moe::Moe(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp,
         ExpertParallel ep, GroupedGemm gemm, bool fused_swiglu)
    : ep_(ep),
      num_experts_(config.moe->num_local_experts),
      top_k_(config.moe->num_experts_per_tok),
      capacity_factor_(config.moe->capacity_factor),
      global_scope_(config.moe->aux_loss_scope == recipe::AuxLossScope::GlobalBatch) {
  const auto& moe = *config.moe;
  router_options_.top_k = top_k_;
  router_options_.sigmoid = moe.scoring_func == recipe::ScoringFunc::Sigmoid;
  router_options_.n_group = moe.n_group;
  router_options_.topk_group = moe.topk_group;
  router_options_.normalize = moe.norm_topk_prob;
  router_options_.scaling = moe.routed_scaling_factor;
  if (tp.size > 1 && !tp.sp())
    throw std::logic_error("an MoE layer under tensor parallelism needs sequence parallelism (each tp rank routes "
                           "its own part of the sequence)");
  router_ = Linear(params, prefix + "gate.weight", config.hidden_size, num_experts_, LinearKind::Replicated, tp);
  // Each tp rank routes other tokens: the router's gradient is summed over tp as well.
  if (tp.sp()) params.all().back().grad_group = mesh::GroupKind::TpDpCp;
  params.all().back().layer_matrix = false;  // Muon leaves routers to AdamW
  const size_t before = params.all().size();
  if (num_experts_ % ep.size != 0)
    throw std::logic_error(fmt::format("{} experts do not split over ep = {}", num_experts_, ep.size));
  const int64_t local = num_experts_ / ep.size;
  first_expert_ = ep.rank * local;
  if (ep.etp.size > 1 && !ep.etp.group)
    throw std::logic_error(fmt::format("an MoE layer with etp = {} needs its etp group", ep.etp.size));
  experts_ = GroupedExperts(params, prefix + "experts.", first_expert_, local, config.hidden_size,
                            moe.moe_intermediate_size, ep.etp, gemm);
  dispatcher_ = ExpertDispatcher(ep, num_experts_);
  // Expert weights are reduced over the expert-data-parallel group (MoE folding) and held by this
  // ep rank only (and split over etp by their shards).
  for (size_t i = before; i < params.all().size(); ++i) {
    params.all()[i].grad_group = mesh::GroupKind::Edp;
    params.all()[i].expert = ep.size > 1;
  }
  if (moe.num_shared_experts > 0)
    shared_.emplace(params, prefix + "shared_experts.", config.hidden_size,
                    moe.moe_intermediate_size * moe.num_shared_experts, tp, /*mixtral_names=*/false, fused_swiglu);
}

namespace {

int64_t group_size(const comm::Communicator* group) { return group ? group->size() : 1; }

at::Tensor all_reduced(at::Tensor t, comm::Communicator* group) {
  if (group && group->size() > 1) group->all_reduce(t, comm::ReduceOp::Sum)->wait();
  return t;
}

}  // namespace

std::pair<at::Tensor, int64_t> Moe::expert_frequencies(const Routing& routing, int64_t tokens) const {
  at::NoGradGuard no_grad;
  const at::Tensor counts = at::bincount(routing.chosen.reshape({-1}), {}, num_experts_).to(at::kFloat);
  if (!global_scope_) {
    // Micro-batch scope: the copies of the whole micro-batch, over the ranks that hold its parts.
    const int64_t total = tokens * group_size(ep_.sequence_group);
    return {all_reduced(counts, ep_.sequence_group) / double(std::max<int64_t>(total * top_k_, 1)), total};
  }
  // Global-batch scope (Megatron): the counts of the micro-batches in flight at once across
  // tp x dp x cp, accumulated over the step's micro-batches so far. A recomputed layer replays the
  // frequencies of its first pass.
  const int64_t total = tokens * group_size(ep_.batch_group);
  MoeStepState& s = *state_;
  if (recompute_pass() == RecomputePass::Replay) {
    if (s.replay.empty()) throw std::logic_error("MoE recomputation replays a micro-batch that was never counted");
    at::Tensor f = s.replay.front();
    s.replay.pop_front();
    return {f, total};
  }
  const at::Tensor slot = all_reduced(counts, ep_.batch_group);
  s.batch_counts = s.batch_counts.defined() ? s.batch_counts + slot : slot;
  ++s.batch_slots;
  const at::Tensor f = s.batch_counts / double(s.batch_slots) / double(std::max<int64_t>(total * top_k_, 1));
  if (recompute_pass() == RecomputePass::First) s.replay.push_back(f);
  return {f, total};
}

MoeOutput Moe::forward(const at::Tensor& x, const at::Tensor& token_keys) const {
  const auto shape = x.sizes().vec();
  const int64_t hidden = x.size(-1);
  const at::Tensor tokens = x.reshape({-1, hidden});
  const int64_t n = tokens.size(0);

  const at::Tensor logits = router_.forward(tokens);
  const Routing routing = route(logits, router_options_, routing_bias_);

  MoeOutput result;
  const auto [f, counted_tokens] = expert_frequencies(routing, n);
  result.aux_loss = load_balancing_part(routing.probs, f, counted_tokens);
  result.z_loss = z_loss_part(logits, n * group_size(ep_.sequence_group));

  // Which copies the capacity keeps, counted over the whole micro-batch.
  const int64_t copies = n * top_k_;
  at::Tensor kept = at::arange(copies, at::TensorOptions().dtype(at::kLong).device(x.device()));
  if (capacity_factor_) {
    const int64_t total = copies * group_size(ep_.sequence_group);
    const auto capacity = int64_t(std::ceil(*capacity_factor_ * double(total) / double(num_experts_)));
    const at::Tensor keys = token_keys.defined() ? token_keys.to(kept.device()) : at::arange(n, kept.options());
    kept = at::nonzero(capacity_keep(routing, keys, capacity, num_experts_, ep_.sequence_group)).reshape({-1});
  }
  // The kept copies in expert order (a stable sort keeps token order): their tokens and weights.
  const at::Tensor kept_expert = routing.chosen.reshape({-1}).index_select(0, kept);
  const at::Tensor order = kept.index_select(0, std::get<1>(kept_expert.sort(/*stable=*/true, 0, false)));
  const at::Tensor idx = at::floor_divide(order, top_k_);
  const at::Tensor weight = routing.weights.reshape({-1}).index_select(0, order).to(x.scalar_type());
  // The one host synchronisation: split sizes for the experts and the exchange.
  const at::Tensor counts = at::bincount(kept_expert, {}, num_experts_).cpu();
  const std::vector<int64_t> lengths(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + num_experts_);

  at::Tensor shared;
  const auto run_shared = [&] {
    if (shared_) shared = shared_->forward(tokens.view(shape)).reshape({-1, hidden});
  };
  const at::Tensor y = dispatcher_.run(experts_, tokens.index_select(0, idx), lengths, run_shared);
  at::Tensor combined = at::zeros_like(tokens).index_add(0, idx, y * weight.unsqueeze(1));
  if (shared_) combined = combined + shared;
  result.output = combined.view(shape);
  result.tokens_per_expert = counts;

  // Per-step statistics, once per micro-batch (not again when a recomputed layer replays).
  if (recompute_pass() != RecomputePass::Replay) {
    at::NoGradGuard no_grad;
    MoeStepState& s = *state_;
    const at::Tensor load = counts.to(at::kFloat);  // on the host already (the split sizes)
    s.tokens_per_expert = s.tokens_per_expert.defined() ? s.tokens_per_expert + load : load;
    s.min_margin = s.min_margin.defined() ? at::minimum(s.min_margin, routing.margin) : routing.margin;
    const at::Tensor z = result.z_loss.detach();
    s.z_loss = s.z_loss.defined() ? s.z_loss + z : z;
  }
  return result;
}

}  // namespace trainer::model
