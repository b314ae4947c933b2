#include "train/optimizer_driver.h"
#include "checkpoint/manifest_check.h"
#include "core/plural.h"
#include "runtime/trace_scope.h"
#include "parallel/data/replicas.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

namespace trainer::train {

OptimizerDriver::OptimizerDriver(model::Transformer& model, const recipe::Recipe& recipe,
                                 const mesh::ProcessGroups& groups)
    : model_(model),
      groups_(groups),
      zero_stage_(recipe.parallel.zero),
      accumulate_unsharded_(recipe.parallel.accumulate_unsharded()),
      reshard_after_forward_(recipe.parallel.reshard_after_forward()) {
  auto& params = model.parameters().all();
  parallel::BucketOptions options;
  options.bucket_bytes = int64_t(recipe.parallel.grad_bucket_mb * 1024 * 1024);
  options.overlap = recipe.parallel.overlap_grad_reduce;
  options.sharded = recipe.parallel.zero >= 1 && groups.get(mesh::GroupKind::DpCp).size() > 1;
  options.shard_gradients = recipe.parallel.zero >= 2;
  options.accumulate_unsharded = recipe.parallel.accumulate_unsharded();
  options.per_unit = recipe.parallel.zero >= 3;
  options.grad_dtype = recipe.parallel.grad_reduce_dtype == "bf16" && !params.empty()
                           ? params.front().tensor.scalar_type()
                           : at::kFloat;
  if (!params.empty() && params.front().tensor.scalar_type() == at::kDouble) options.grad_dtype = at::kDouble;
  options.initial_value = [&set = model.parameters()](const model::Parameter& p) { return set.initial_value(p); };
  buckets_ = std::make_unique<parallel::GradBuckets>(params, groups, options);
  std::optional<parallel::Zero3Options> zero3;
  if (options.sharded && recipe.parallel.zero >= 3) {
    zero3.emplace();
    zero3->reshard_after_forward = recipe.parallel.reshard_after_forward();
    // Under pipeline parallelism a stage's parameters stay gathered for all of its micro-batches
    // (torchtitan's default; the gradients are then reduced once, after the last one).
    zero3->reshard_after_backward = recipe.parallel.pp == 1;
    zero3->head_unit = model.head_unit();
    const std::string& schedule = recipe.parallel.pipeline_schedule;
    zero3->keep_head = schedule == "zero_bubble" || schedule == "zbv";
  }
  if (options.sharded)
    zero1_ = std::make_unique<parallel::DistributedOptimizer>(*buckets_, model.parameters(), recipe.optimizer,
                                                              recipe.parallel.overlap_param_gather, zero3);
  else
    adamw_ = std::make_unique<optim::AdamW>(params, recipe.optimizer);
}

const parallel::OverlapStats* OptimizerDriver::overlap() const {
  for (const auto& b : buckets_->buckets())
    if (b.comm->size() > 1) {
      overlap_ = buckets_->stats();
      if (zero1_) overlap_.param_gather_wait_s = zero1_->gather_wait_s();
      return &overlap_;
    }
  return nullptr;
}

std::function<void(model::Parameter&, const at::Tensor&)> OptimizerDriver::parameter_writer() {
  if (!unit_gathers()) return nullptr;
  return [this](model::Parameter& p, const at::Tensor& slice) { zero1_->load_parameter(p, slice); };
}

parallel::UnitGathers* OptimizerDriver::unit_gathers() { return zero1_ ? zero1_->unit_gathers() : nullptr; }

std::optional<std::vector<checkpoint::TensorRecord>> OptimizerDriver::parameter_records() const {
  if (!zero1_ || !zero1_->unit_gathers()) return std::nullopt;
  return zero1_->parameter_records();
}

void OptimizerDriver::wait_parameter_gathers() {
  if (zero1_) zero1_->wait_gathers();
}

std::string OptimizerDriver::describe() const {
  const auto& all = buckets_->buckets();
  const int64_t ranks = groups_.get(mesh::GroupKind::DpCp).size();
  const int64_t replicas = groups_.get(mesh::GroupKind::DpCpReplicate).size();
  const std::string over = replicas > 1 && zero1_ ? fmt::format("{} x {} data-parallel ranks (hybrid: sharded over {}, "
                                                                "replicated {} times)",
                                                                ranks / replicas, replicas, ranks / replicas, replicas)
                                                  : fmt::format("{} data-parallel ranks", ranks);
  const std::string buckets = count_of(int64_t(all.size()), "gradient bucket", "gradient buckets");
  const std::string dtype =
      all.empty() ? "" : fmt::format(", {} gradients", buckets_->reduced(all.front()).scalar_type() == at::kBFloat16 ? "bf16" : "fp32");
  if (zero1_ && zero_stage_ >= 3)
    return fmt::format("ZeRO-3 over {} (parameters gathered per layer, {}; gradients reduce-scattered {}), {}{}", over,
                       zero1_->unit_gathers() && reshard_after_forward_ ? "released after forward"
                                                                        : "kept from forward to backward",
                       accumulate_unsharded_ ? "once per step" : "every micro-batch", buckets, dtype);
  if (zero1_ && zero_stage_ >= 2)
    return fmt::format("ZeRO-2 over {} (gradients reduce-scattered {}), {}{}", over,
                       accumulate_unsharded_ ? "once per step" : "every micro-batch", buckets, dtype);
  if (zero1_) return fmt::format("ZeRO-1 over {}, {}{}", over, buckets, dtype);
  if (ranks > 1) return fmt::format("replicated AdamW, {} all-reduced over {} ranks{}", buckets, ranks, dtype);
  return "AdamW" + dtype;
}

void OptimizerDriver::begin_step() {
  // ZeRO-3: whatever is still gathered (the whole model after loading, an evaluation's leftovers)
  // is freed; the step gathers unit by unit.
  if (parallel::UnitGathers* gathers = unit_gathers()) gathers->release_all();
  buckets_->begin_step();
}
void OptimizerDriver::begin_backward(int64_t chunk, bool last) { buckets_->begin_backward(chunk, last); }
void OptimizerDriver::end_backward(int64_t chunk) {
  buckets_->end_backward(chunk);
  if (parallel::UnitGathers* gathers = unit_gathers()) gathers->end_backward(chunk);
}
void OptimizerDriver::finish_gradients() {
  // ZeRO-3: gathered parameters would be stale after the update.
  if (parallel::UnitGathers* gathers = unit_gathers()) gathers->release_all();
  buckets_->finish();
  // A tied embedding split across the pipeline: the embedding's and the head copy's gradients
  // (each already summed over dp x cp) are added on both ends, so both copies take the same step.
  // Middle stages hold no copy (and have no embedding group).
  for (const auto& p : model_.parameters().all())
    if (p.tied_across_stages) return buckets_->sum_tied_across_stages(groups_.get(mesh::GroupKind::Embedding));
}

at::Tensor OptimizerDriver::grad_norm() { return buckets_->grad_norm(); }

void OptimizerDriver::clip(double max_norm, const at::Tensor& norm) {
  if (max_norm <= 0) return;
  // optim::clip_coefficient on the device: max_norm / (norm + 1e-6) when the norm exceeds max_norm.
  at::NoGradGuard no_grad;
  const at::Tensor coefficient =
      at::where(norm > max_norm, at::full({}, max_norm, norm.options()) / (norm + 1e-6), at::ones({}, norm.options()));
  buckets_->scale(coefficient);
}

void OptimizerDriver::step(double lr) {
  const runtime::TraceScope scope("optimizer step");
  if (zero1_)
    zero1_->step(lr);
  else
    adamw_->step(lr);
}

void OptimizerDriver::zero_grad() { buckets_->zero_grad(); }

void OptimizerDriver::refresh_master_weights() {
  if (zero1_)
    zero1_->refresh_master_weights();
  else
    adamw_->refresh_master_weights();
}

int64_t OptimizerDriver::steps_taken() const { return zero1_ ? zero1_->steps_taken() : adamw_->steps_taken(); }

std::vector<checkpoint::TensorRecord> OptimizerDriver::checkpoint_records() const {
  if (zero1_) return zero1_->checkpoint_records();
  std::vector<checkpoint::TensorRecord> out;
  for (const auto& s : adamw_->state()) {
    // The state has the parameter's slice's shape (steps: a scalar).
    const model::Parameter* p = model_.parameters().find(checkpoint::parameter_of_optimizer_state(s.name));
    if (p && s.tensor.dim() > 0 && p->real_numel() == 0) continue;  // padding rows only
    auto record = s.tensor.dim() == 0 || !p
                      ? checkpoint::TensorRecord::whole(s.name, s.tensor)
                      : checkpoint::TensorRecord::slice(s.name, p->real_part(s.tensor), p->global_shape, p->offsets());
    // Held by every rank with the same slice of the parameter (its step count: every rank of the
    // stage holding the parameter).
    const auto holders = p && s.tensor.dim() > 0 ? parallel::parameter_replicas(groups_.layout(), groups_.global_rank(), *p)
                         : p ? parallel::holder_replicas(groups_.layout(), groups_.global_rank(), *p)
                             : parallel::stage_replicas(groups_.layout(), groups_.global_rank());
    if (holders.ranks.size() > 1) record.replicated = parallel::as_replication(holders);
    out.push_back(std::move(record));
  }
  return out;
}

void OptimizerDriver::load_state(const parallel::StateReader& read, int64_t steps_taken) {
  at::NoGradGuard no_grad;
  if (zero1_) {
    zero1_->load_state(read);
    zero1_->set_steps_taken(steps_taken);
    return;
  }
  for (const auto& s : adamw_->state()) {
    const model::Parameter* p = model_.parameters().find(checkpoint::parameter_of_optimizer_state(s.name));
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
  adamw_->set_steps_taken(steps_taken);
}

}  // namespace trainer::train
