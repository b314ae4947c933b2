#include "train/optimizer_driver.h"
#include "core/plural.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

namespace trainer::train {

OptimizerDriver::OptimizerDriver(model::Transformer& model, const recipe::Recipe& recipe, comm::Communicator& dp)
    : model_(model) {
  auto& params = model.parameters().all();
  const bool sharded = recipe.parallel.zero >= 1 && dp.size() > 1;
  if (dp.size() > 1)
    buckets_ = std::make_unique<parallel::GradBuckets>(
        params, dp, sharded ? parallel::GradReduction::ReduceScatter : parallel::GradReduction::AllReduce,
        int64_t(recipe.parallel.grad_bucket_mb * 1024 * 1024), recipe.parallel.overlap_grad_reduce);
  if (sharded)
    zero1_ = std::make_unique<parallel::DistributedOptimizer>(*buckets_, params, recipe.optimizer);
  else
    adamw_ = std::make_unique<optim::AdamW>(params, recipe.optimizer);
}

std::string OptimizerDriver::describe() const {
  const std::string buckets = buckets_ ? count_of(int64_t(buckets_->buckets().size()), "gradient bucket", "gradient buckets") : "";
  if (zero1_) return fmt::format("ZeRO-1 over {} data-parallel ranks, {}", buckets_->group().size(), buckets);
  if (buckets_) return fmt::format("replicated AdamW, {} all-reduced over {} ranks", buckets, buckets_->group().size());
  return "AdamW";
}

void OptimizerDriver::begin_step() {
  if (buckets_) buckets_->begin_step();
}
void OptimizerDriver::begin_micro_batch(bool last) {
  if (buckets_) buckets_->begin_micro_batch(last);
}
void OptimizerDriver::end_micro_batch() {
  if (buckets_) buckets_->mark_backward_end();
}
void OptimizerDriver::finish_gradients() {
  if (buckets_) buckets_->finish();
}

double OptimizerDriver::grad_norm() {
  if (zero1_) return zero1_->grad_norm();
  return optim::global_grad_norm(model_.parameters().all()).item<double>();
}

void OptimizerDriver::clip(double max_norm, double norm) {
  if (!zero1_) {
    optim::clip_gradients(model_.parameters().all(), max_norm, norm);
    return;
  }
  const double coefficient = optim::clip_coefficient(max_norm, norm);
  if (coefficient != 1.0) zero1_->scale_gradients(coefficient);
}

void OptimizerDriver::step(double lr) {
  if (zero1_)
    zero1_->step(lr);
  else
    adamw_->step(lr);
}

void OptimizerDriver::zero_grad() {
  if (buckets_)
    buckets_->zero_grad();
  else
    adamw_->zero_grad();
}

int64_t OptimizerDriver::steps_taken() const { return zero1_ ? zero1_->steps_taken() : adamw_->steps_taken(); }

namespace {

// "optimizer.<kind>.<parameter>" -> "<parameter>" (the names optim::AdamW::state() gives).
std::string parameter_of_state(const std::string& state_name) {
  return state_name.substr(state_name.find('.', std::string("optimizer.").size()) + 1);
}

}  // namespace

std::vector<checkpoint::TensorRecord> OptimizerDriver::checkpoint_records() const {
  if (zero1_) return zero1_->checkpoint_records();
  std::vector<checkpoint::TensorRecord> out;
  for (const auto& s : adamw_->state()) {
    // The state has the parameter's slice's shape (steps: a scalar).
    const model::Parameter* p = model_.parameters().find(parameter_of_state(s.name));
    auto record = s.tensor.dim() == 0 || !p ? checkpoint::TensorRecord::whole(s.name, s.tensor)
                                            : checkpoint::TensorRecord::slice(s.name, s.tensor, p->global_shape, p->offsets());
    record.replicated = true;
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
    const model::Parameter* p = model_.parameters().find(parameter_of_state(s.name));
    const bool sliced = s.tensor.dim() > 0 && p;
    const auto stored = read(s.name, sliced ? p->offsets() : std::vector<int64_t>(size_t(s.tensor.dim()), 0),
                             s.tensor.sizes().vec());
    if (stored)
      s.tensor.copy_(*stored);
    else if (s.name.rfind("optimizer.master.", 0) == 0 && p)
      s.tensor.copy_(p->tensor.detach());  // saved from an fp32 run: the parameters are the master weights
  }
  adamw_->set_steps_taken(steps_taken);
}

}  // namespace trainer::train
