#include "engine/zero/distributed_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/replicas.h"
#include "optim/local_optimizer.h"
#include "optim/state_layout.h"

namespace trainer::engine {

namespace {
// The master shard of fp32 parameters is the parameters' own storage: nothing to copy then.
void copy_unless_same(const at::Tensor& to, const at::Tensor& from) {
  if (to.data_ptr() == from.data_ptr() && to.sizes() == from.sizes() && to.strides() == from.strides()) return;
  to.copy_(from);
}
}  // namespace

DistributedOptimizer::DistributedOptimizer(GradBuckets& buckets, model::ParameterSet& params,
                                           const recipe::OptimizerConfig& config, bool overlap_gather,
                                           const std::optional<Zero3Options>& zero3)
    : buckets_(buckets),
      set_(params),
      params_(params.all()),
      overlap_gather_(overlap_gather && !zero3),
      config_(config),
      rule_(optim::make_update_rule(config)) {
  at::NoGradGuard no_grad;
  auto& all = buckets.buckets();
  gathers_.resize(all.size());
  for (size_t b = 0; b < all.size(); ++b)
    for (size_t p : all[b].params) {
      const auto unit = size_t(params_[p].unit);
      if (unit_buckets_.size() <= unit) unit_buckets_.resize(unit + 1);
      auto& list = unit_buckets_[unit];
      if (std::find(list.begin(), list.end(), b) == list.end()) list.push_back(b);
    }
  if (overlap_gather_) {
    model::UnitHooks hooks;
    hooks.before_forward = [this](int64_t unit) { wait_unit(unit); };
    set_.set_unit_hooks(std::move(hooks));
  }
  for (size_t b = 0; b < all.size(); ++b) {
    auto& bucket = all[b];
    const int64_t lo = GradBuckets::shard_begin(bucket), n = GradBuckets::shard_numel(bucket), hi = lo + n;
    const at::Tensor mine = bucket.shard_values.defined() ? bucket.shard_values : bucket.values.narrow(0, lo, n);
    // fp32 parameters are their own master weights: the update writes this rank's shard of the
    // parameter storage in place, with no second fp32 copy of it.
    masters_.push_back(mine.scalar_type() == at::kFloat ? mine : mine.to(at::kFloat));
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const int64_t begin = bucket.offsets[i], end = begin + params_[bucket.params[i]].tensor.numel();
      const int64_t a = std::max(begin, lo), z = std::min(end, hi);
      if (a >= z) continue;
      fragments_.push_back({b, bucket.params[i], a - begin, a - lo, z - a});
      steps_.push_back(at::zeros({}, masters_.back().options()));  // beside the shard: the fused CUDA kernel reads it there
    }
  }
  // The state of each fragment, made once the fragment list is final (geometry_ holds pointers).
  geometry_.reserve(fragments_.size());
  for (const Fragment& fr : fragments_) {
    const model::Parameter& p = params_[fr.param];
    geometry_.push_back(optim::piece_geometry(p, fr.param_offset, fr.length));
    states_.push_back(rule_->make_state(geometry_.back(), masters_[fr.bucket].options()));
  }
  if (rule_->blockwise()) {
    const auto quantized = [&](size_t param) {
      const model::Parameter& p = params_[param];
      const auto specs = rule_->state_specs(optim::piece_geometry(p, 0, p.tensor.numel()));
      return std::any_of(specs.begin(), specs.end(), [](const optim::StateSpec& s) { return s.per_block; });
    };
    // Every parameter, not only those with a fragment here: every rank refuses alike.
    for (size_t i = 0; i < params_.size(); ++i)
      if (quantized(i)) optim::check_block_split(params_[i]);
    cut_blocks_ = std::make_unique<CutBlocks>(buckets, params_, quantized);
  }
  if (rule_->whole_matrices()) {
    // Every layer matrix of every bucket, in bucket order (the same list on every rank of a
    // bucket's group), with this rank's fragment of it if it has one.
    std::vector<WholeMatrices::Held> held;
    for (size_t b = 0; b < all.size(); ++b)
      for (size_t i = 0; i < all[b].params.size(); ++i) {
        const size_t param = all[b].params[i];
        if (!params_[param].layer_matrix || params_[param].global_shape.size() != 2 ||
            params_[param].tensor.numel() == 0)
          continue;
        int64_t piece = -1;
        for (size_t f = 0; f < fragments_.size(); ++f)
          if (fragments_[f].bucket == b && fragments_[f].param == param) piece = int64_t(f);
        held.push_back({param, all[b].comm, all[b].offsets[i], GradBuckets::shard_numel(all[b]), piece});
      }
    whole_matrices_ = std::make_unique<WholeMatrices>(buckets.groups(), params_, std::move(held),
                                                      masters_.empty() ? at::Device(at::kCPU) : masters_.front().device());
  }
  if (zero3) zero3_gathers_ = std::make_unique<Zero3Gathers>(buckets, params, *zero3);
}

void DistributedOptimizer::step(double lr) {
  at::NoGradGuard no_grad;
  auto& all = buckets_.buckets();
  // Gathers a forward did not need end first: with fp32 parameters the update writes the storage
  // they gather into.
  for (size_t b = 0; b < all.size(); ++b) gather_wait_s_ += finish_gather(b);
  std::vector<optim::Piece> pieces;
  std::vector<CutBlocks::Fragment> owners;
  for (size_t f = 0; f < fragments_.size(); ++f) {
    const Fragment& fr = fragments_[f];
    pieces.push_back({masters_[fr.bucket].narrow(0, fr.shard_offset, fr.length),
                      buckets_.reduced(all[fr.bucket]).narrow(0, fr.shard_offset, fr.length), steps_[f], &states_[f],
                      &geometry_[f]});
    owners.push_back({fr.bucket, fr.param, &geometry_[f]});
  }
  optim::CrossPiece cross;
  if (rule_->blockwise())
    cross.reduce_maxima = [&](std::vector<at::Tensor>& maxima) {
      cut_blocks_->reduce(buckets_, owners, maxima);
      std::vector<const model::Parameter*> params;
      for (const auto& o : owners) params.push_back(&params_[o.param]);
      reduce_split_rows(buckets_.groups(), params, maxima);
    };
  if (whole_matrices_)
    cross.orthogonalize = [&](std::vector<at::Tensor>& inputs, const std::function<void()>& meanwhile) {
      whole_matrices_->orthogonalize(inputs, [&](const at::Tensor& m) { return rule_->orthogonalize(m); }, meanwhile);
    };
  optim::run_update(*rule_, pieces, lr, config_.weight_decay, steps_taken_ + 1, optim::LocalOptimizer::kCopyBudgetBytes,
                    cross);
  if (zero3_gathers_) {
    // ZeRO-3: the next forward gathers each unit from the updated shards.
    for (size_t b = 0; b < all.size(); ++b) copy_unless_same(zero3_gathers_->shard(b), masters_[b]);
    last_gather_wait_s_ = zero3_gathers_->take_wait_s();
    gather_wait_s_ = 0;
    ++steps_taken_;
    return;
  }
  // Write the updated shard into the parameter storage and gather every rank's shard. Buckets hold
  // parameters in reverse order (as backward produces gradients): gathering them last bucket first
  // brings the first layers' parameters first, as the next forward needs them (the same order on
  // every rank of a group).
  last_gather_wait_s_ = gather_wait_s_;
  gather_wait_s_ = 0;
  for (size_t b = all.size(); b-- > 0;) {
    auto& bucket = all[b];
    at::Tensor mine = bucket.values.narrow(0, buckets_.shard_begin(bucket), buckets_.shard_numel(bucket));
    copy_unless_same(mine, masters_[b]);
    gathers_[b] = bucket.comm->all_gather(bucket.values, mine);  // in place: no copy of the shard
  }
  if (!overlap_gather_)
    for (size_t b = 0; b < all.size(); ++b) last_gather_wait_s_ += finish_gather(b);
  ++steps_taken_;
}

DistributedOptimizer::~DistributedOptimizer() {
  if (overlap_gather_) set_.set_unit_hooks({});
}

double DistributedOptimizer::finish_gather(size_t bucket) {
  auto& g = gathers_[bucket];
  if (!g) return 0;
  const auto start = std::chrono::steady_clock::now();
  g->wait();
  g.reset();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void DistributedOptimizer::wait_gathers() {
  for (size_t b = 0; b < gathers_.size(); ++b) finish_gather(b);
}

void DistributedOptimizer::wait_unit(int64_t unit) {
  if (unit < 0 || size_t(unit) >= unit_buckets_.size()) return;
  for (size_t b : unit_buckets_[size_t(unit)]) gather_wait_s_ += finish_gather(b);
}

void DistributedOptimizer::refresh_master_weights() {
  at::NoGradGuard no_grad;
  auto& all = buckets_.buckets();
  for (size_t b = 0; b < all.size(); ++b)
    copy_unless_same(masters_[b],
                     all[b].shard_values.defined()
                         ? all[b].shard_values
                         : all[b].values.narrow(0, GradBuckets::shard_begin(all[b]), GradBuckets::shard_numel(all[b])));
}

checkpoint::TensorRecord::Replication DistributedOptimizer::fragment_holders(const Fragment& fr) const {
  const mesh::ProcessGroups& groups = buckets_.groups();
  // The same fragment is on the ranks that hold the same slice and the same shard of the bucket.
  return as_replication(
      shard_replicas(groups.layout(), groups.global_rank(), params_[fr.param], buckets_.buckets()[fr.bucket].group));
}

void DistributedOptimizer::add_fragment_records(const std::string& prefix, const std::vector<at::Tensor>& buffers,
                                                std::vector<checkpoint::TensorRecord>& out) const {
  for (const Fragment& fr : fragments_) {
    const auto& p = params_[fr.param];
    const auto holders = fragment_holders(fr);
    // Padding rows (a padded vocabulary) end the parameter in row-major order: only the real prefix is saved.
    const int64_t length = std::min(fr.length, p.real_numel() - fr.param_offset);
    if (length <= 0) continue;
    out.push_back(checkpoint::TensorRecord::flat(prefix + p.name, buffers[fr.bucket].narrow(0, fr.shard_offset, length),
                                                 p.global_shape, p.offsets(), p.real_sizes(), fr.param_offset));
    if (holders.count > 1) out.back().replicated = holders;
  }
}

void DistributedOptimizer::load_parameter(const model::Parameter& p, const at::Tensor& real_slice) {
  at::NoGradGuard no_grad;
  size_t index = 0;
  while (index < params_.size() && &params_[index] != &p) ++index;  // a deque: no pointer arithmetic
  if (index == params_.size()) throw std::logic_error("load_parameter: " + p.name + " is not a parameter of this model");
  // The local slice with its padding rows (zeros), flat, as the bucket lays it out.
  at::Tensor local = at::zeros(p.tensor.sizes(), real_slice.options().dtype(p.tensor.scalar_type()));
  if (p.real_numel() > 0) p.real_part(local).copy_(real_slice);
  const at::Tensor flat = local.reshape({-1});
  for (const Fragment& fr : fragments_)
    if (fr.param == index)
      buckets_.buckets()[fr.bucket].shard_values.narrow(0, fr.shard_offset, fr.length)
          .copy_(flat.narrow(0, fr.param_offset, fr.length));
}

std::vector<checkpoint::TensorRecord> DistributedOptimizer::parameter_records() const {
  std::vector<checkpoint::TensorRecord> out;
  if (!zero3_gathers_) return out;
  std::vector<at::Tensor> shards;
  for (size_t b = 0; b < masters_.size(); ++b) shards.push_back(zero3_gathers_->shard(b));
  add_fragment_records("", shards, out);
  return out;
}

std::vector<checkpoint::TensorRecord> DistributedOptimizer::checkpoint_records() const {
  const bool fp32_params = !params_.empty() && params_.front().tensor.scalar_type() == at::kFloat;
  const mesh::ProcessGroups& groups = buckets_.groups();
  std::vector<checkpoint::TensorRecord> out;
  if (!fp32_params) add_fragment_records("optimizer.master.", masters_, out);  // else the parameters are the masters
  for (size_t f = 0; f < fragments_.size(); ++f) {
    const Fragment& fr = fragments_[f];
    const auto& p = params_[fr.param];
    const auto holders = fragment_holders(fr);
    const auto specs = rule_->state_specs(geometry_[f]);
    for (size_t k = 0; k < specs.size(); ++k) {
      const std::string name = "optimizer." + specs[k].name + "." + p.name;
      if (specs[k].per_block) {
        const auto slice = optim::block_slice(p, geometry_[f]);
        if (!slice) continue;
        out.push_back(checkpoint::TensorRecord::flat(name, states_[f][k].narrow(0, slice->piece_index, slice->count),
                                                     slice->global_shape, slice->offsets, slice->slice_shape,
                                                     slice->begin));
      } else {
        // Padding rows (a padded vocabulary) end the parameter in row-major order: only the real prefix is saved.
        const int64_t length = std::min(fr.length, p.real_numel() - fr.param_offset);
        if (length <= 0) continue;
        out.push_back(checkpoint::TensorRecord::flat(name, states_[f][k].narrow(0, 0, length), p.global_shape,
                                                     p.offsets(), p.real_sizes(), fr.param_offset));
      }
      if (holders.count > 1) out.back().replicated = holders;
    }
  }
  for (const auto& p : params_) {
    auto step = checkpoint::TensorRecord::whole("optimizer.step." + p.name, at::full({}, double(steps_taken_), at::kFloat));
    step.replicated = as_replication(holder_replicas(groups.layout(), groups.global_rank(), p));
    out.push_back(std::move(step));
  }
  return out;
}

void DistributedOptimizer::load_state(const StateReader& read) {
  at::NoGradGuard no_grad;
  for (size_t f = 0; f < fragments_.size(); ++f) {
    const Fragment& fr = fragments_[f];
    const auto& p = params_[fr.param];
    const int64_t length = std::min(fr.length, p.real_numel() - fr.param_offset);  // the rest: padding, zeros
    if (length > 0) {
      const at::Tensor master = masters_[fr.bucket].narrow(0, fr.shard_offset, length);
      const std::optional<at::Tensor> stored = read("optimizer.master." + p.name, p.offsets(), p.real_sizes());
      if (stored)
        copy_unless_same(master, stored->reshape({-1}).narrow(0, fr.param_offset, length));
      else if (zero3_gathers_)  // ZeRO-3: the parameters' shard (loaded before)
        copy_unless_same(master, buckets_.buckets()[fr.bucket].shard_values.narrow(0, fr.shard_offset, length));
      else
        copy_unless_same(master, p.real_part(p.tensor.detach()).reshape({-1}).narrow(0, fr.param_offset, length));
    }
    const auto specs = rule_->state_specs(geometry_[f]);
    for (size_t k = 0; k < specs.size(); ++k) {
      const std::string name = "optimizer." + specs[k].name + "." + p.name;
      if (specs[k].per_block) {
        const optim::BlockSlice layout = optim::block_layout(p);
        const optim::BlockRange range = optim::touched_blocks(p, geometry_[f]);
        if (range.count == 0) continue;
        const auto stored = read(name, layout.offsets, layout.slice_shape);
        if (stored) states_[f][k].narrow(0, 0, range.count).copy_(stored->reshape({-1}).narrow(0, range.slice_begin, range.count));
      } else if (length > 0) {
        const auto stored = read(name, p.offsets(), p.real_sizes());
        if (stored) states_[f][k].narrow(0, 0, length).copy_(stored->reshape({-1}).narrow(0, fr.param_offset, length));
      }
    }
    if (const auto step = read("optimizer.step." + p.name, {}, {})) steps_[f].copy_(*step);
  }
}

}  // namespace trainer::engine
