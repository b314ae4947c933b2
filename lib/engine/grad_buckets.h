#pragma once
// The gradients of a model in contiguous buffers, reduced in buckets (DESIGN.md section 6 and
// invariant 8). Each parameter's main_grad is a view into its bucket's buffer, fp32 by default
// (also for bf16 parameters: accumulation over micro-batches and the reduction run in fp32, as in
// Megatron and torchtitan) or the parameters' dtype (parallel.grad_reduce_dtype bf16). Gradient
// contributions are added there (model::accumulate_gradient; a post-accumulate hook moves the
// gradients autograd computes itself, the norms', into it).
//
// Buckets hold parameters of one model chunk and one reduction group (dp x cp for dense weights,
// edp for experts; a tied embedding split across the pipeline alone), filled in reverse parameter order (roughly the order backward produces
// gradients) up to a size. A bucket's reduction is launched (asynchronously) the moment its last
// gradient of the step has arrived (after the chunk's last micro-batch began its backward, every
// use of every parameter has contributed; deferred weight gradients count when they run), in
// bucket order per communicator (every rank of a communicator must launch in the same order), while backward
// continues. Earlier micro-batches communicate nothing.
//
// Reduction: a sum (the loss is normalised by the global token count). Sharded (ZeRO-1): each
// rank receives the summed gradients of its shard of the bucket only, and the parameters
// themselves live in per-bucket buffers (padded to a multiple of the group size) so that the
// updated shards can be all-gathered.
//
// Sharded gradients (ZeRO-2): a bucket keeps only its reduced shard for the whole step. The
// full-size buffer is allocated when the bucket's first contribution arrives (Parameter::grad_buffer),
// handed to the reduce-scatter and released when it completes; at most two reductions per
// communicator are in flight (launching a third waits for the oldest), so besides the shards about
// three buckets of full gradients exist at a time. By default every micro-batch reduces: a bucket
// reduces once per micro-batch of its chunk, the r-th time when the contributions of r
// micro-batches have arrived (deferred weight gradients of an earlier micro-batch may ride along
// with a later reduction: the sum is the same). Per communicator, reductions launch in a fixed
// order, round by round and by bucket index within a round, so every rank issues the same
// collectives in the same order. With accumulate_unsharded the full buffers live from the first
// contribution to the step's single reduction (ZeRO-1's gradient memory during backward).
#include <ATen/core/Tensor.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "mesh/process_groups.h"
#include "model/parameter.h"

namespace trainer::engine {

struct OverlapStats {
  int64_t buckets = 0;
  int64_t launched_in_backward = 0;  // buckets whose reduction started before backward returned
  double first_launch_s = -1;        // seconds from begin_step() to the first launch
  double backward_end_s = -1;        // seconds from begin_step() to the end of the last backward
  double param_gather_wait_s = -1;   // ZeRO: seconds waited for parameter all-gathers (-1: none)
};

struct BucketOptions {
  int64_t bucket_bytes = 40 << 20;
  bool overlap = true;                                   // false: every reduction starts in finish()
  bool sharded = false;                                  // ZeRO-1: reduce-scatter, parameters in the buckets
  c10::ScalarType grad_dtype = c10::ScalarType::Float;   // of the gradient buffers
  bool shard_gradients = false;                          // ZeRO-2 (needs sharded)
  bool accumulate_unsharded = false;                     // ZeRO-2: one reduction per step, not per micro-batch
  // ZeRO-3 (needs sharded): a bucket holds parameters of one forward unit (model::Parameter::unit);
  // each bucket keeps this rank's shard of its parameters (Bucket::shard_values) and its full
  // values are released as soon as they are filled.
  bool per_unit = false;
  // The initial values of parameters created without storage (model::ParameterOptions::deferred).
  std::function<at::Tensor(const model::Parameter&)> initial_value;
};

class GradBuckets {
 public:
  struct Bucket {
    int64_t chunk = 0;
    mesh::GroupKind group = mesh::GroupKind::DpCp;  // sharded over (hybrid: DpCpShard)
    bool tied_across_stages = false;  // holds only a tied embedding copy (see sum_tied_across_stages)
    comm::Communicator* comm = nullptr;
    // Hybrid sharding: the reduced shard is then all-reduced over the replicas of the shard group.
    comm::Communicator* replicas = nullptr;
    std::vector<size_t> params;    // indices into the parameter list
    std::vector<int64_t> offsets;  // element offset of each parameter in the buffers
    int64_t numel = 0;             // used elements
    int64_t padded_numel = 0;      // a multiple of the group size when sharded
    int64_t expected = 0;          // gradient contributions per micro-batch (the parameters' uses)
    at::Tensor grads;              // [padded_numel] in the gradient dtype (ZeRO-2: only while accumulating)
    at::Tensor values;             // [padded_numel] parameter storage (sharded only; ZeRO-3: only while gathered)
    at::Tensor shard_values;       // ZeRO-3: this rank's shard of `values`, kept for the whole run
    // ZeRO-2 (sharded gradients, group of more than one rank): the reduced shard [padded_numel / n].
    bool sharded_grads = false;
    at::Tensor shard_grads;
    int64_t ready = 0;             // contributions this step
    int64_t rounds_due = 0;        // reductions that may launch (all their contributions arrived)
    int64_t launches = 0;          // reductions launched this step
    std::unique_ptr<comm::Work> work;
  };

  GradBuckets(std::deque<model::Parameter>& params, const mesh::ProcessGroups& groups, const BucketOptions& options);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  void begin_step();
  // Around one micro-batch's backward of a chunk; `last`: the step's last micro-batch for that
  // chunk (the one that reduces).
  void begin_backward(int64_t chunk, bool last);
  void end_backward(int64_t chunk);
  // Launches what has not started (parameters without a gradient this step, overlap off) and
  // waits for every reduction. Afterwards the buffers hold the reduced gradients (all of them, or
  // this rank's shard).
  void finish();
  void zero_grad();
  // After finish(): adds the reduced gradients of the tied embedding's copies on the two ends of a
  // pipeline (over `embedding`, the embedding group), so both copies take the same step. Each copy
  // has a bucket of its own, so its shard covers the same elements on both ends under ZeRO-1.
  void sum_tied_across_stages(comm::Communicator& embedding);

  // The L2 norm of all reduced gradients of the model across every rank, each unique element
  // counted once (replicas.h): a 0-dim double tensor on the gradients' device. A collective over
  // the world unless every rank holds every gradient.
  at::Tensor grad_norm();
  // Multiplies the reduced gradients (this rank's shards when sharded) by a 0-dim tensor.
  void scale(const at::Tensor& coefficient);
  // After finish(): what a bucket holds of its reduced gradients. Unsharded: all of them; sharded:
  // this rank's shard ([shard_begin, shard_begin + shard_numel) of the bucket).
  static at::Tensor reduced(const Bucket& b, bool sharded);
  at::Tensor reduced(const Bucket& b) const { return reduced(b, options_.sharded); }

  std::vector<Bucket>& buckets() { return buckets_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  bool sharded() const { return options_.sharded; }
  const mesh::ProcessGroups& groups() const { return groups_; }
  const OverlapStats& stats() const { return stats_; }
  // This rank's shard of a bucket when sharded: [shard_begin, shard_begin + shard_numel).
  static int64_t shard_numel(const Bucket& b) { return b.padded_numel / b.comm->size(); }
  static int64_t shard_begin(const Bucket& b) { return shard_numel(b) * b.comm->rank(); }

  void on_gradient_ready(size_t bucket);  // called as contributions arrive
  // ZeRO-2: allocates the bucket's full buffer (zeros) and points its parameters' main_grad into it
  // when it has none (called before each contribution).
  void ensure_buffer(size_t bucket);

 private:
  // A ZeRO-2 reduce-scatter in flight: its full-size input is released when it completes; its
  // output is the bucket's shard (the step's first reduction) or a temporary added to it.
  struct InFlight {
    size_t bucket;
    std::unique_ptr<comm::Work> work;
    at::Tensor input, output;
  };
  void launch_ready_in_order();
  void launch(size_t bucket);
  void launch_sharded_grads(size_t index);
  void retire_oldest(const comm::Communicator* comm);
  void release_buffer(Bucket& bucket);

  std::deque<model::Parameter>& params_;
  const mesh::ProcessGroups& groups_;
  comm::Communicator& world_;
  BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<bool> reducing_;      // per chunk: the current micro-batch is its last one
  std::vector<bool> in_backward_;   // per chunk
  std::vector<int64_t> backwards_;  // per chunk: backward passes begun this step
  // Buckets launch in index order per communicator (round by round under ZeRO-2): a bucket waits
  // for the earlier buckets of its communicator only (the expert buckets' completion depends on
  // routing; the others' must not).
  std::deque<InFlight> in_flight_;  // ZeRO-2 reductions, oldest first
  // For the norm: per parameter, whether this rank counts it (its whole slice, or its part of the
  // shard when sharded); false everywhere but the first replica.
  std::vector<bool> counted_;
  bool norm_is_local_ = false;      // every rank holds every gradient: no collective
  std::chrono::steady_clock::time_point step_start_;
  OverlapStats stats_;
};

}  // namespace trainer::engine
