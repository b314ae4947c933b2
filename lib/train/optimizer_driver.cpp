#include "train/optimizer_driver.h"
#include "core/plural.h"
#include "runtime/trace_scope.h"
#include "train/replicated_optimizer.h"
#include "train/zero_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

namespace trainer::train {

namespace {

// ZeRO shards only over more than one data-parallel rank; on one, it is replicated AdamW.
bool sharded(const recipe::Recipe& recipe, const mesh::ProcessGroups& groups) {
  return recipe.parallel.zero >= 1 && groups.get(mesh::GroupKind::DpCp).size() > 1;
}

engine::BucketOptions bucket_options(const recipe::Recipe& recipe, model::ParameterSet& set,
                                       const mesh::ProcessGroups& groups) {
  const auto& params = set.all();
  engine::BucketOptions options;
  options.bucket_bytes = int64_t(recipe.parallel.grad_bucket_mb * 1024 * 1024);
  options.overlap = recipe.parallel.overlap_grad_reduce;
  options.sharded = sharded(recipe, groups);
  options.shard_gradients = recipe.parallel.zero >= 2;
  options.accumulate_unsharded = recipe.parallel.accumulate_unsharded();
  options.per_unit = recipe.parallel.zero >= 3;
  options.grad_dtype = recipe.parallel.grad_reduce_dtype == recipe::Precision::BF16 && !params.empty()
                           ? params.front().tensor.scalar_type()
                           : at::kFloat;
  if (!params.empty() && params.front().tensor.scalar_type() == at::kDouble) options.grad_dtype = at::kDouble;
  options.initial_value = [set = &set](const model::Parameter& p) { return set->initial_value(p); };
  return options;
}

}  // namespace

OptimizerDriver::OptimizerDriver(model::Transformer& model, const recipe::Recipe& recipe,
                                 const mesh::ProcessGroups& groups)
    : model_(model),
      groups_(groups),
      buckets_(std::make_unique<engine::GradBuckets>(model.parameters().all(), groups,
                                                       bucket_options(recipe, model.parameters(), groups))) {
  // The one place that decides which optimizer runs; every method below asks it, never which it is.
  if (sharded(recipe, groups))
    optimizer_ = std::make_unique<ZeroOptimizer>(*buckets_, model, recipe, groups);
  else
    optimizer_ = std::make_unique<ReplicatedOptimizer>(model.parameters(), recipe.optimizer, groups);
}

const engine::OverlapStats* OptimizerDriver::overlap() const {
  for (const auto& b : buckets_->buckets())
    if (b.comm->size() > 1) {
      overlap_ = buckets_->stats();
      overlap_.param_gather_wait_s = optimizer_->parameter_gather_wait_s();
      return &overlap_;
    }
  return nullptr;
}

std::function<void(model::Parameter&, const at::Tensor&)> OptimizerDriver::parameter_writer() {
  return optimizer_->parameter_writer();
}

std::optional<std::vector<checkpoint::TensorRecord>> OptimizerDriver::parameter_records() const {
  return optimizer_->parameter_records();
}

void OptimizerDriver::wait_parameter_gathers() { optimizer_->wait_parameter_gathers(); }

std::string OptimizerDriver::describe() const {
  const auto& all = buckets_->buckets();
  const std::string buckets = count_of(int64_t(all.size()), "gradient bucket", "gradient buckets");
  const std::string dtype =
      all.empty() ? "" : fmt::format(", {} gradients", buckets_->reduced(all.front()).scalar_type() == at::kBFloat16 ? "bf16" : "fp32");
  return optimizer_->describe(buckets, dtype);
}

void OptimizerDriver::begin_step() {
  // ZeRO-3: whatever is still gathered (the whole model after loading, an evaluation's leftovers)
  // is freed; the step gathers unit by unit.
  optimizer_->release_gathered_parameters();
  buckets_->begin_step();
}
void OptimizerDriver::begin_backward(int64_t chunk, bool last) { buckets_->begin_backward(chunk, last); }
void OptimizerDriver::end_backward(int64_t chunk) {
  buckets_->end_backward(chunk);
  optimizer_->end_backward(chunk);
}
void OptimizerDriver::finish_gradients() {
  // ZeRO-3: gathered parameters would be stale after the update.
  optimizer_->release_gathered_parameters();
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
  optimizer_->step(lr);
}

void OptimizerDriver::zero_grad() { buckets_->zero_grad(); }

void OptimizerDriver::refresh_master_weights() { optimizer_->refresh_master_weights(); }

int64_t OptimizerDriver::steps_taken() const { return optimizer_->steps_taken(); }

std::vector<checkpoint::TensorRecord> OptimizerDriver::checkpoint_records() const {
  return optimizer_->checkpoint_records();
}

void OptimizerDriver::load_state(const engine::StateReader& read, int64_t steps_taken) {
  optimizer_->load_state(read, steps_taken);
}

}  // namespace trainer::train
