#include "engine/grad_buckets.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "model/tensor_storage.h"
#include "engine/replicas.h"

namespace trainer::engine {

namespace {

// Gradients autograd accumulates itself (the norms' weights): moved into main_grad as they arrive.
struct MoveToMainGrad : torch::autograd::PostAccumulateGradHook {
  MoveToMainGrad(GradBuckets* owner, model::Parameter* param, size_t bucket) : owner(owner), param(param), bucket(bucket) {}
  void operator()(const torch::autograd::Variable& variable) override {
    at::Tensor& grad = variable.mutable_grad();
    if (!grad.defined()) return;  // called for the custom layers' weights too, which add their own
    owner->ensure_buffer(bucket);
    param->main_grad.add_(grad);
    grad.reset();
    owner->on_gradient_ready(bucket);
  }
  GradBuckets* owner;
  model::Parameter* param;
  size_t bucket;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

GradBuckets::GradBuckets(std::deque<model::Parameter>& params, const mesh::ProcessGroups& groups,
                         const BucketOptions& options)
    : params_(params), groups_(groups), world_(groups.world()), options_(options) {
  // Fill one open bucket per (chunk, group) in reverse parameter order.
  const int64_t element_bytes = int64_t(c10::elementSize(options.grad_dtype));
  std::map<std::tuple<int64_t, int, bool, int64_t>, Bucket> open;
  int64_t chunks = 1;
  for (size_t k = params.size(); k-- > 0;) {
    const model::Parameter& p = params[k];
    chunks = std::max(chunks, p.chunk + 1);
    const std::tuple<int64_t, int, bool, int64_t> key{p.chunk, int(p.grad_group), p.tied_across_stages,
                                                      options.per_unit ? p.unit : -1};
    Bucket& b = open[key];
    if (b.params.empty()) {
      b.chunk = p.chunk;
      b.group = p.grad_group;
      b.tied_across_stages = p.tied_across_stages;
      // Hybrid sharding (dense weights): ZeRO shards inside the shard group; the replicas of each
      // shard sum theirs after the reduce-scatter.
      if (options.sharded && b.group == mesh::GroupKind::DpCp &&
          groups.get(mesh::GroupKind::DpCpReplicate).size() > 1) {
        b.group = mesh::GroupKind::DpCpShard;
        b.replicas = &groups.get(mesh::GroupKind::DpCpReplicate);
      }
      b.comm = &groups.get(b.group);
    }
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.tensor.numel();
    b.expected += p.uses;
    if (b.numel * element_bytes >= options.bucket_bytes || p.tied_across_stages) {
      buckets_.push_back(std::move(b));
      open.erase(key);
    }
  }
  for (auto& [key, b] : open) buckets_.push_back(std::move(b));
  // Launch order: the bucket whose last parameter comes latest in backward (the lowest index) last.
  std::stable_sort(buckets_.begin(), buckets_.end(),
                   [](const Bucket& a, const Bucket& b) { return a.params.back() > b.params.back(); });
  reducing_.assign(size_t(chunks), false);
  in_backward_.assign(size_t(chunks), false);
  backwards_.assign(size_t(chunks), 0);

  at::NoGradGuard no_grad;
  const mesh::RankLayout& layout = groups.layout();
  const int64_t rank = groups.global_rank();
  counted_.assign(params.size(), false);
  norm_is_local_ = true;
  for (size_t index = 0; index < buckets_.size(); ++index) {
    Bucket& bucket = buckets_[index];
    const int64_t n = bucket.comm->size();
    bucket.padded_numel = options.sharded ? (bucket.numel + n - 1) / n * n : bucket.numel;
    const auto& first = params[bucket.params.front()].tensor;
    const auto grad_options = first.options().dtype(options.grad_dtype).requires_grad(false);
    bucket.sharded_grads = options.sharded && options.shard_gradients && n > 1;
    if (bucket.sharded_grads)
      bucket.shard_grads = at::zeros({bucket.padded_numel / n}, grad_options);
    else
      bucket.grads = at::zeros({bucket.padded_numel}, grad_options);
    if (options.sharded) bucket.values = at::zeros({bucket.padded_numel}, first.options().requires_grad(false));
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      model::Parameter& p = params[bucket.params[i]];
      const int64_t numel = p.tensor.numel();
      if (options.sharded) {
        // Move the parameter into the bucket's storage; layers hold the same tensor, so they see it.
        at::Tensor view = bucket.values.narrow(0, bucket.offsets[i], numel).view(p.tensor.sizes());
        if (model::has_storage(p.tensor))
          view.copy_(p.tensor.detach());
        else if (options.initial_value)
          view.copy_(options.initial_value(p));
        else
          throw std::logic_error("parameter " + p.name + " has no values and no initialiser");
        p.tensor.set_data(view);
      }
      if (bucket.sharded_grads)
        p.grad_buffer = [this, index] { ensure_buffer(index); };
      else
        p.main_grad = bucket.grads.narrow(0, bucket.offsets[i], numel).view(p.tensor.sizes());
      p.grad_ready = [this, index] { on_gradient_ready(index); };
      torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, std::make_unique<MoveToMainGrad>(this, &p, index));
      const ReplicaSet replicas = parameter_replicas(layout, rank, p);
      counted_[bucket.params[i]] =
          options.sharded ? shard_replicas(layout, rank, p, bucket.group).first() : replicas.first();
      if (int64_t(replicas.ranks.size()) != layout.world_size() || (options.sharded && n > 1)) norm_is_local_ = false;
    }
    if (options.sharded && options.per_unit) {
      // ZeRO-3: only the shard stays; the next forward gathers the rest. A bucket of a one-rank
      // group (experts when edp is 1, hybrid shards of one rank) is its own shard and stays whole.
      if (n == 1) {
        bucket.shard_values = bucket.values;
      } else {
        bucket.shard_values = bucket.values.narrow(0, shard_begin(bucket), shard_numel(bucket)).clone();
        model::release_storage(bucket.values);
      }
    }
  }
  if (norm_is_local_) counted_.assign(params.size(), true);
  stats_.buckets = int64_t(buckets_.size());
}

GradBuckets::~GradBuckets() {
  for (auto& p : params_) {
    torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
    p.main_grad = at::Tensor();
    p.grad_ready = nullptr;
    p.grad_buffer = nullptr;
  }
}

void GradBuckets::begin_step() {
  step_start_ = std::chrono::steady_clock::now();
  stats_ = OverlapStats{int64_t(buckets_.size())};
  std::fill(reducing_.begin(), reducing_.end(), false);
  std::fill(backwards_.begin(), backwards_.end(), 0);
  for (auto& b : buckets_) {
    b.ready = 0;
    b.rounds_due = 0;
    b.launches = 0;
    b.work.reset();
  }
}

void GradBuckets::begin_backward(int64_t chunk, bool last) {
  reducing_[size_t(chunk)] = last;
  in_backward_[size_t(chunk)] = true;
  ++backwards_[size_t(chunk)];
}

void GradBuckets::end_backward(int64_t chunk) {
  in_backward_[size_t(chunk)] = false;
  if (reducing_[size_t(chunk)]) stats_.backward_end_s = seconds_since(step_start_);
}

void GradBuckets::on_gradient_ready(size_t index) {
  Bucket& bucket = buckets_[index];
  ++bucket.ready;
  const int64_t begun = backwards_[size_t(bucket.chunk)];
  if (bucket.sharded_grads && !options_.accumulate_unsharded) {
    // ZeRO-2, every micro-batch: round r is due once r micro-batches' contributions have arrived.
    bucket.rounds_due = std::min(begun, bucket.ready / bucket.expected);
  } else {
    if (!reducing_[size_t(bucket.chunk)] || bucket.ready < bucket.expected * begun) return;
    bucket.rounds_due = 1;
  }
  if (options_.overlap) launch_ready_in_order();
}

void GradBuckets::ensure_buffer(size_t index) {
  Bucket& b = buckets_[index];
  if (!b.sharded_grads || b.grads.defined()) return;
  b.grads = at::zeros({b.padded_numel}, b.shard_grads.options());
  for (size_t i = 0; i < b.params.size(); ++i) {
    model::Parameter& p = params_[b.params[i]];
    p.main_grad = b.grads.narrow(0, b.offsets[i], p.tensor.numel()).view(p.tensor.sizes());
  }
}

void GradBuckets::release_buffer(Bucket& b) {
  b.grads = at::Tensor();
  for (size_t i : b.params) params_[i].main_grad = at::Tensor();
}

void GradBuckets::launch_ready_in_order() {
  // Per communicator the next reduction is the bucket with the fewest launches this step, the
  // lowest index among equals: every rank launches a communicator's collectives in the same
  // order, whatever order the contributions came in (an expert bucket's depends on routing).
  for (bool progress = true; progress;) {
    progress = false;
    std::vector<std::pair<const comm::Communicator*, size_t>> next;  // per communicator
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const comm::Communicator* c = buckets_[i].comm;
      auto it = std::find_if(next.begin(), next.end(), [&](const auto& n) { return n.first == c; });
      if (it == next.end())
        next.emplace_back(c, i);
      else if (buckets_[i].launches < buckets_[it->second].launches)
        it->second = i;
    }
    for (const auto& [c, i] : next)
      if (buckets_[i].rounds_due > buckets_[i].launches) {
        launch(i);
        progress = true;
      }
  }
}

void GradBuckets::launch(size_t index) {
  Bucket& bucket = buckets_[index];
  const double t = seconds_since(step_start_);
  if (stats_.first_launch_s < 0) stats_.first_launch_s = t;
  if (in_backward_[size_t(bucket.chunk)] && bucket.launches == 0) ++stats_.launched_in_backward;
  if (bucket.sharded_grads) return launch_sharded_grads(index);
  ++bucket.launches;
  if (bucket.comm->size() == 1) return;
  if (!options_.sharded) {
    bucket.work = bucket.comm->all_reduce(bucket.grads, comm::ReduceOp::Sum);
  } else {
    at::Tensor shard = bucket.grads.narrow(0, shard_begin(bucket), shard_numel(bucket));
    // The rest of the buffer is not read again this step: Gloo may reduce it in place.
    bucket.work = bucket.comm->reduce_scatter_consuming(shard, bucket.grads, comm::ReduceOp::Sum);
  }
}

void GradBuckets::launch_sharded_grads(size_t index) {
  Bucket& b = buckets_[index];
  // At most two reductions per communicator in flight: their full-size inputs are the memory.
  int64_t on_comm = 0;
  for (const auto& f : in_flight_) on_comm += buckets_[f.bucket].comm == b.comm;
  for (; on_comm >= 2; --on_comm) retire_oldest(b.comm);
  ensure_buffer(index);  // a round without contributions since the last one reduces zeros
  at::Tensor input = b.grads;
  release_buffer(b);     // later contributions go into a new buffer
  // The step's first reduction writes the shard; later ones go through a temporary, added when done.
  at::Tensor output = b.launches == 0 ? b.shard_grads : at::empty_like(b.shard_grads);
  ++b.launches;
  auto work = b.comm->reduce_scatter_consuming(output, input, comm::ReduceOp::Sum);  // released when done
  in_flight_.push_back({index, std::move(work), std::move(input), std::move(output)});
}

void GradBuckets::retire_oldest(const comm::Communicator* comm) {
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                         [&](const InFlight& f) { return !comm || buckets_[f.bucket].comm == comm; });
  if (it == in_flight_.end()) return;
  it->work->wait();
  Bucket& b = buckets_[it->bucket];
  if (!it->output.is_same(b.shard_grads)) b.shard_grads.add_(it->output);
  // The full-size input goes now, not whenever the backend's own references to it go (Gloo's
  // worker threads drop theirs at a time of their choosing; NCCL recorded its stream on it).
  model::release_storage(it->input);
  in_flight_.erase(it);
}

void GradBuckets::finish() {
  // Whatever has not launched now launches: one reduction per bucket, or under ZeRO-2 with overlap
  // one per micro-batch of the chunk (the same count on every rank).
  for (auto& b : buckets_) {
    const bool per_microbatch = b.sharded_grads && !options_.accumulate_unsharded && options_.overlap;
    b.rounds_due = per_microbatch ? std::max<int64_t>(1, backwards_[size_t(b.chunk)]) : std::max<int64_t>(1, b.launches);
  }
  launch_ready_in_order();
  for (auto& b : buckets_)
    if (b.work) b.work->wait();
  while (!in_flight_.empty()) retire_oldest(nullptr);
  // Hybrid sharding: each shard summed over its replicas (every rank in bucket order).
  std::vector<std::unique_ptr<comm::Work>> across;
  for (auto& b : buckets_)
    if (b.replicas) {
      at::Tensor mine = reduced(b);
      across.push_back(b.replicas->all_reduce(mine, comm::ReduceOp::Sum));
    }
  for (auto& w : across) w->wait();
}

void GradBuckets::sum_tied_across_stages(comm::Communicator& embedding) {
  for (auto& b : buckets_) {
    if (!b.tied_across_stages || embedding.size() == 1) continue;
    at::Tensor mine = reduced(b);
    embedding.all_reduce(mine, comm::ReduceOp::Sum)->wait();
  }
}

void GradBuckets::zero_grad() {
  for (auto& b : buckets_) {
    if (!b.sharded_grads) {
      b.grads.zero_();
      continue;
    }
    b.shard_grads.zero_();
    if (b.grads.defined()) release_buffer(b);
  }
}

at::Tensor GradBuckets::reduced(const Bucket& b, bool sharded) {
  if (b.sharded_grads) return b.shard_grads;
  return sharded ? b.grads.narrow(0, shard_begin(b), shard_numel(b)) : b.grads;
}

at::Tensor GradBuckets::grad_norm() {
  at::NoGradGuard no_grad;
  // In parameter order, each counted gradient (or its part of this rank's shard).
  std::vector<at::Tensor> parts;
  if (!options_.sharded) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (counted_[i]) parts.push_back(params_[i].main_grad);
  } else {
    for (const auto& bucket : buckets_) {
      const int64_t lo = shard_begin(bucket), hi = lo + shard_numel(bucket);
      for (size_t j = 0; j < bucket.params.size(); ++j) {
        const int64_t begin = bucket.offsets[j], end = begin + params_[bucket.params[j]].tensor.numel();
        const int64_t a = std::max(begin, lo), z = std::min(end, hi);
        if (a < z && counted_[bucket.params[j]]) parts.push_back(reduced(bucket).narrow(0, a - lo, z - a));
      }
    }
  }
  const auto device = buckets_.empty() ? at::Device(at::kCPU) : reduced(buckets_.front()).device();
  // The fp32 norm of this rank's parts (as torch's clip_grad_norm_), squared exactly in double.
  at::Tensor local = parts.empty() ? at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device))
                                   : at::stack(at::_foreach_norm(parts, 2, at::kFloat)).norm().to(at::kDouble);
  at::Tensor total = local * local;
  if (!norm_is_local_) world_.all_reduce(total, comm::ReduceOp::Sum)->wait();
  return total.sqrt();
}

void GradBuckets::scale(const at::Tensor& coefficient) {
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    reduced(bucket).mul_(coefficient);
  }
}

}  // namespace trainer::engine
