#include "train/replicated_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "checkpoint/manifest_check.h"
#include "engine/block_maxima.h"
#include "engine/replicas.h"
#include "optim/state_layout.h"

namespace trainer::train {

ReplicatedOptimizer::ReplicatedOptimizer(model::ParameterSet& params, const recipe::OptimizerConfig& config,
                                         const mesh::ProcessGroups& groups)
    : params_(params), groups_(groups), optimizer_(params.all(), config) {
  // 8-bit blocks of rows split by tp are shared with the other tp ranks.
  optimizer_.set_maxima_reducer([&groups](const std::vector<const model::Parameter*>& owners,
                                          std::vector<at::Tensor>& maxima) {
    engine::reduce_split_rows(groups, owners, maxima);
  });
  if (optimizer_.rule().whole_matrices()) {
    // Every rank holds its whole tp slice of each matrix: the tp group assembles the matrices.
    std::vector<engine::WholeMatrices::Held> held;
    const auto& all = params.all();
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].layer_matrix && all[i].global_shape.size() == 2 && all[i].tensor.numel() > 0)
        held.push_back({i, nullptr, 0, 0, int64_t(i)});
    whole_matrices_ = std::make_unique<engine::WholeMatrices>(groups, all, std::move(held),
                                                              all.empty() ? at::Device(at::kCPU) : all.front().tensor.device());
    optimizer_.set_matrix_assembler([this](std::vector<at::Tensor>& inputs, const std::function<void()>& meanwhile) {
      whole_matrices_->orthogonalize(
          inputs, [this](const at::Tensor& m) { return optimizer_.rule().orthogonalize(m); }, meanwhile);
    });
  }
}

std::vector<checkpoint::TensorRecord> ReplicatedOptimizer::checkpoint_records() const {
  std::vector<checkpoint::TensorRecord> out;
  for (const auto& s : optimizer_.state()) {
    const model::Parameter* p = s.parameter;
    if (s.piece) {  // per-block state: the blocks of the parameter's slice
      const auto slice = optim::block_slice(*p, *s.piece);
      if (!slice) continue;
      auto record = checkpoint::TensorRecord::flat(s.name, s.tensor.narrow(0, slice->piece_index, slice->count),
                                                   slice->global_shape, slice->offsets, slice->slice_shape, slice->begin);
      const auto holders = engine::parameter_replicas(groups_.layout(), groups_.global_rank(), *p);
      if (holders.ranks.size() > 1) record.replicated = engine::as_replication(holders);
      out.push_back(std::move(record));
      continue;
    }
    // The state has the parameter's slice's shape (steps: a scalar).
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
  for (const auto& s : optimizer_.state()) {
    const model::Parameter* p = s.parameter;
    if (s.piece) {  // per-block state
      const optim::BlockSlice layout = optim::block_layout(*p);
      const optim::BlockRange range = optim::touched_blocks(*p, *s.piece);
      if (range.count == 0) continue;
      if (const auto stored = read(s.name, layout.offsets, layout.slice_shape))
        s.tensor.narrow(0, 0, range.count).copy_(stored->reshape({-1}).narrow(0, range.slice_begin, range.count));
      continue;
    }
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
  optimizer_.set_steps_taken(steps_taken);
}

std::string ReplicatedOptimizer::describe(const std::string& buckets, const std::string& dtype) const {
  const int64_t ranks = groups_.get(mesh::GroupKind::DpCp).size();
  const std::string name = optimizer_.rule().describe();
  if (ranks > 1) return fmt::format("replicated {}, {} all-reduced over {} ranks{}", name, buckets, ranks, dtype);
  return name + dtype;
}

}  // namespace trainer::train
