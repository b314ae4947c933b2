#pragma once
// Collective communication within one process group, with asynchronous handles. Backends: Gloo
// (CPU, through libtorch's c10d), NCCL (GPU, raw NCCL calls on a communication stream ordered
// against compute with CUDA events), and a free one for groups of one rank. A failure or a
// timeout throws CommError naming the operation, the group and the training step.
#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::comm {

enum class ReduceOp { Sum, Avg, Max };

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shared by every communicator of a process: the step (for messages) and the timeout.
struct CommContext {
  int64_t global_rank = 0;
  std::atomic<int64_t> step{0};
  // Host nanoseconds this rank spent blocked in Work::wait, all communicators together (the step
  // breakdown's exposed communication).
  std::atomic<int64_t> wait_ns{0};
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};

  // The blocked time by group name ("dp_cp", "ep", ...): which communication was exposed, an MoE
  // layer's token dispatch (ep) apart from the gradient reductions (dp_cp), say. Adds to wait_ns.
  void add_wait(const std::string& group, int64_t ns) {
    wait_ns += ns;
    const std::lock_guard<std::mutex> lock(wait_mutex_);
    wait_ns_by_group_[group] += ns;
  }
  std::map<std::string, int64_t> waits_by_group() const {
    const std::lock_guard<std::mutex> lock(wait_mutex_);
    return wait_ns_by_group_;
  }

 private:
  mutable std::mutex wait_mutex_;
  std::map<std::string, int64_t> wait_ns_by_group_;
};

// An operation in flight. wait() returns when the result is usable (on GPU: usable by work queued
// on the current stream afterwards) or throws CommError.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Whether the operation has finished without waiting (its buffers may be reused); false when
  // the backend cannot tell. wait() may still be called after.
  virtual bool done() { return false; }
};

// One message of a send_recv batch. Between two ranks a receive takes the send with the same tag,
// whatever order the two sides post them in, so two messages of the same shape to one peer (a
// pipeline's activations of two micro-batches, say) cannot be swapped. Gloo matches by tag; NCCL
// has no tags and matches in posting order, so its backend issues every batch's messages sorted
// by (peer, tag) on both sides; across batches it relies on both sides posting batches in the
// same order. Tags are 0..2^31-1.
struct P2POp {
  enum class Kind { Send, Recv } kind;
  at::Tensor tensor;
  int64_t peer;      // rank within the group
  int64_t tag = 0;
};

// ops sorted by (peer, tag), stable; throws CommError for a tag outside 0..2^31-1.
std::vector<P2POp> in_matching_order(const std::vector<P2POp>& ops);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int64_t rank() const = 0;  // within the group
  virtual int64_t size() const = 0;
  virtual const std::string& name() const = 0;  // "dp", "tp", ... for messages
  virtual const std::vector<int64_t>& global_ranks() const = 0;

  // In place.
  virtual std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // input: size() equal chunks (flat, contiguous); output: this rank's reduced chunk.
  virtual std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  // The same for an input the caller is done with: its contents are undefined once the work
  // completes (output may be a view of it). Gloo, which has no reduce-scatter, then all-reduces
  // the input in place instead of a copy of it.
  virtual std::unique_ptr<Work> reduce_scatter_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op) {
    return reduce_scatter(output, input, op);
  }
  // output: the concatenation of every rank's input (flat, contiguous), rank order. The input may
  // be this rank's chunk of the output itself (in place).
  virtual std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  // Along dim 0 with uneven splits: input rows [sum(in_splits[:j]), +in_splits[j]) go to rank j;
  // output rows from rank j land at [sum(out_splits[:j]), +out_splits[j]).
  virtual std::unique_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) = 0;
  // Several sends and receives started together (one batch), completing together.
  virtual std::unique_ptr<Work> send_recv(const std::vector<P2POp>& ops) = 0;
  virtual std::unique_ptr<Work> broadcast(at::Tensor& tensor, int64_t root) = 0;
  virtual void barrier() = 0;
};

// The group of one rank: every collective is the identity (no copies, no communication).
std::unique_ptr<Communicator> make_self_communicator(std::string name, int64_t global_rank);

}  // namespace trainer::comm
