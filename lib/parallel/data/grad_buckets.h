#pragma once
// Data-parallel gradient reduction in buckets (DESIGN.md section 6). Every parameter's .grad is a
// view into a contiguous per-bucket buffer, so autograd accumulates micro-batches in place. On the
// last micro-batch of a step, a post-accumulate-grad hook counts the gradients of each bucket and
// launches the bucket's reduction (asynchronously) the moment its last gradient is final, while
// backward continues with earlier layers. Earlier micro-batches communicate nothing.
//
// Reduction: a sum over the data-parallel group (the loss is already normalised by the global
// token count). With ZeRO-1 (reduce_scatter mode) each rank receives the summed gradients of its
// shard of the bucket only, and the parameters themselves also live in per-bucket buffers (padded
// to a multiple of the group size) so the updated shards can be all-gathered.
#include <ATen/core/Tensor.h>

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/parameter.h"

namespace trainer::parallel {

enum class GradReduction { AllReduce, ReduceScatter };

struct OverlapStats {
  int64_t buckets = 0;
  int64_t launched_in_backward = 0;  // buckets whose reduction started before backward returned
  double first_launch_s = -1;        // seconds from begin_step() to the first launch
  double backward_end_s = -1;        // seconds from begin_step() to mark_backward_end()
};

class GradBuckets {
 public:
  struct Bucket {
    std::vector<size_t> params;    // indices into the parameter list
    std::vector<int64_t> offsets;  // element offset of each parameter in the buffers
    int64_t numel = 0;             // used elements
    int64_t padded_numel = 0;      // a multiple of the group size (reduce_scatter mode)
    at::Tensor grads;              // [padded_numel]
    at::Tensor values;             // [padded_numel] parameter storage (reduce_scatter mode only)
    int64_t ready = 0;
    bool launched = false;
    std::unique_ptr<comm::Work> work;
  };

  // Buckets are filled in reverse parameter order (roughly the order backward produces gradients)
  // up to `bucket_bytes` each. `overlap` false launches every reduction only in finish().
  GradBuckets(std::deque<model::Parameter>& params, comm::Communicator& dp, GradReduction reduction,
              int64_t bucket_bytes, bool overlap);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  void begin_step();
  // Whether the coming backward is the last micro-batch of the step (the one that reduces).
  void begin_micro_batch(bool last);
  void mark_backward_end();
  // Launches what has not started (parameters without a gradient this step, overlap off) and
  // waits for every reduction. Afterwards the buffers hold the reduced gradients (all of them, or
  // this rank's shard).
  void finish();
  void zero_grad();

  std::vector<Bucket>& buckets() { return buckets_; }
  comm::Communicator& group() { return dp_; }
  GradReduction reduction() const { return reduction_; }
  const OverlapStats& stats() const { return stats_; }
  // This rank's shard of a bucket in reduce_scatter mode: [shard_begin, shard_begin + shard_numel).
  int64_t shard_numel(const Bucket& b) const { return b.padded_numel / dp_.size(); }
  int64_t shard_begin(const Bucket& b) const { return shard_numel(b) * dp_.rank(); }

  void on_gradient_ready(size_t bucket);  // called by the hooks

 private:
  void launch(Bucket& bucket);

  std::deque<model::Parameter>& params_;
  comm::Communicator& dp_;
  GradReduction reduction_;
  bool overlap_;
  bool reducing_ = false;  // the current micro-batch is the last one
  bool in_backward_ = false;
  std::vector<Bucket> buckets_;
  std::chrono::steady_clock::time_point step_start_;
  OverlapStats stats_;
};

}  // namespace trainer::parallel
