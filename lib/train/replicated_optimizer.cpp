#include "train/replicated_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "checkpoint/manifest_check.h"
#include "engine/replicas.h"

namespace trainer::train {

ReplicatedOptimizer::ReplicatedOptimizer(model::ParameterSet& params, const recipe::OptimizerConfig& config,
                                         const mesh::ProcessGroups& groups)
    : params_(params), groups_(groups), adamw_(params.all(), config) {}

std::vector<checkpoint::TensorRecord> ReplicatedOptimizer::checkpoint_records() const {
  std::vector<checkpoint::TensorRecord> out;
  for (const auto& s : adamw_.state()) {
    // The state has the parameter's slice's shape (steps: a scalar).
    const model::Parameter* p = params_.find(checkpoint::parameter_of_optimizer_state(s.name));
    if (p && s.tensor.dim() > 0 && p->real_numel() == 0) continue;  // padding rows only
    auto record = s.tensor.dim() == 0 || !p
                      ? checkpoint::TensorRecord::whole(s.name, s.tensor)
                      : checkpoint::TensorRecord::slice(s.name, p->real_part(s.tensor), p->global_shape, p->offsets());
    // Held by every rank with the same slice of the parameter (its step count: every rank of the
    // stage holding the parameter).
    const auto holders = p && s.tensor.dim() > 0 ? engine::parameter_replicas(groups_.layout(), groups_.global_rank(), *p)
                         : p ? engine::holder_replicas(groups_.layout(), groups_.global_rank(), *p)
                             : engine::stage_replicas(groups_.layout(), groups_.global_rank());
    if (holders.ranks.size() > 1) record.replicated = engine::as_replication(holders);
    out.push_back(std::move(record));
  }
  return out;
}

void ReplicatedOptimizer::load_state(const engine::StateReader& read, int64_t steps_taken) {
  at::NoGradGuard no_grad;
  for (const auto& s : adamw_.state()) {
    const model::Parameter* p = params_.find(checkpoint::parameter_of_optimizer_state(s.name));
    const bool sliced = s.tensor.dim() > 0 && p;
    if (sliced && p->real_numel() == 0) continue;  // padding rows only: zeros, and they stay zero
    const at::Tensor target = sliced ? p->real_part(s.tensor) : s.tensor;
    const auto stored = read(s.name, sliced ? p->offsets() : std::vector<int64_t>(size_t(s.tensor.dim()), 0),
                             target.sizes().vec());
    if (stored)
      target.copy_(*stored);
    else if (s.name.rfind("optimizer.master.", 0) == 0 && p)
      s.tensor.copy_(p->tensor.detach());  // saved from an fp32 run: the parameters are the master weights
  }
  adamw_.set_steps_taken(steps_taken);
}

std::string ReplicatedOptimizer::describe(const std::string& buckets, const std::string& dtype) const {
  const int64_t ranks = groups_.get(mesh::GroupKind::DpCp).size();
  if (ranks > 1) return fmt::format("replicated AdamW, {} all-reduced over {} ranks{}", buckets, ranks, dtype);
  return "AdamW" + dtype;
}

}  // namespace trainer::train
