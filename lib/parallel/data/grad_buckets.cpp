#include "parallel/data/grad_buckets.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace trainer::parallel {

namespace {

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyHook(GradBuckets* owner, size_t bucket) : owner(owner), bucket(bucket) {}
  void operator()(const torch::autograd::Variable&) override { owner->on_gradient_ready(bucket); }
  GradBuckets* owner;
  size_t bucket;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

GradBuckets::GradBuckets(std::deque<model::Parameter>& params, comm::Communicator& dp, GradReduction reduction,
                         int64_t bucket_bytes, bool overlap)
    : params_(params), dp_(dp), reduction_(reduction), overlap_(overlap) {
  // Group parameters (in reverse order) into buckets.
  Bucket current;
  const int64_t element_bytes = params.empty() ? 4 : int64_t(params.front().tensor.element_size());
  for (size_t k = params.size(); k-- > 0;) {
    current.params.push_back(k);
    current.offsets.push_back(current.numel);
    current.numel += params[k].tensor.numel();
    if (current.numel * element_bytes >= bucket_bytes || k == 0) {
      buckets_.push_back(std::move(current));
      current = Bucket();
    }
  }
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const int64_t n = dp.size();
    bucket.padded_numel = reduction == GradReduction::ReduceScatter ? (bucket.numel + n - 1) / n * n : bucket.numel;
    const auto& first = params[bucket.params.front()].tensor;
    bucket.grads = at::zeros({bucket.padded_numel}, first.options().requires_grad(false));
    if (reduction == GradReduction::ReduceScatter)
      bucket.values = at::zeros({bucket.padded_numel}, first.options().requires_grad(false));
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      model::Parameter& p = params[bucket.params[i]];
      const int64_t numel = p.tensor.numel();
      if (reduction == GradReduction::ReduceScatter) {
        // Move the parameter into the bucket's storage; layers hold the same tensor, so they see it.
        at::Tensor view = bucket.values.narrow(0, bucket.offsets[i], numel).view(p.tensor.sizes());
        view.copy_(p.tensor.detach());
        p.tensor.set_data(view);
      }
      p.tensor.mutable_grad() = bucket.grads.narrow(0, bucket.offsets[i], numel).view(p.tensor.sizes());
      torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, std::make_unique<ReadyHook>(this, b));
    }
  }
  stats_.buckets = int64_t(buckets_.size());
}

GradBuckets::~GradBuckets() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
}

void GradBuckets::begin_step() {
  step_start_ = std::chrono::steady_clock::now();
  stats_ = OverlapStats{int64_t(buckets_.size())};
  for (auto& b : buckets_) {
    b.ready = 0;
    b.launched = false;
    b.work.reset();
  }
}

void GradBuckets::begin_micro_batch(bool last) {
  reducing_ = last;
  in_backward_ = true;
  for (auto& b : buckets_) b.ready = 0;
}

void GradBuckets::mark_backward_end() {
  in_backward_ = false;
  if (reducing_) stats_.backward_end_s = seconds_since(step_start_);
}

void GradBuckets::on_gradient_ready(size_t index) {
  Bucket& bucket = buckets_[index];
  ++bucket.ready;
  if (reducing_ && overlap_ && !bucket.launched && bucket.ready == int64_t(bucket.params.size())) launch(bucket);
}

void GradBuckets::launch(Bucket& bucket) {
  bucket.launched = true;
  const double t = seconds_since(step_start_);
  if (stats_.first_launch_s < 0) stats_.first_launch_s = t;
  if (in_backward_) ++stats_.launched_in_backward;
  if (dp_.size() == 1) return;
  if (reduction_ == GradReduction::AllReduce) {
    bucket.work = dp_.all_reduce(bucket.grads, comm::ReduceOp::Sum);
  } else {
    at::Tensor shard = bucket.grads.narrow(0, shard_begin(bucket), shard_numel(bucket));
    bucket.work = dp_.reduce_scatter(shard, bucket.grads, comm::ReduceOp::Sum);
  }
}

void GradBuckets::finish() {
  for (auto& b : buckets_)
    if (!b.launched) launch(b);
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
}

void GradBuckets::zero_grad() {
  for (auto& b : buckets_) b.grads.zero_();
}

}  // namespace trainer::parallel
