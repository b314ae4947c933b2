#pragma once
// A replay of tensor allocations: every tensor an operation creates, who keeps it (the local
// variable, autograd's saved tensors), and when the last owner lets go. Its running sum is the
// "allocated" memory of the device allocator, and its maximum the peak. The same replay records
// what each operation costs (GEMM shapes, attention FLOPs, bytes moved by memory-bound kernels,
// collectives), so memory and time come from one description of the code (model/*_replay.h).
#include <cstdint>
#include <vector>

namespace trainer::counting {

// The process groups a collective can run in (DESIGN.md section 6).
enum class CommGroup { Tp, Cp, Ep, Etp, Dp, Edp, Pp };
enum class CommKind { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };

struct GemmShape {
  double m = 0, n = 0, k = 0;  // [m,k] x [k,n]: 2*m*n*k FLOPs
  double bytes = 0;            // operands and result: (m*k + k*n + m*n) * element size
  bool grouped = false;        // the experts' products (at::_grouped_mm, or one matmul per expert)
  double flops() const { return 2.0 * m * n * k; }
};

struct CommOp {
  CommKind kind = CommKind::AllReduce;
  CommGroup group = CommGroup::Tp;
  double bytes = 0;          // the full (unsharded) buffer each rank contributes or receives
  bool overlapped = false;   // run concurrently with computation that hides it (ring attention)
  // GEMMs issued while this collective is in flight (the column-parallel backward's weight
  // gradients behind its input gradient's all-reduce): only the time beyond theirs is exposed.
  std::vector<GemmShape> behind;
  // A collective matmul (parallel/tensor/collective_matmul.h): the collective runs as this many
  // send/recv steps of bytes / (ring_steps + 1) each, and `behind` holds the GEMMs of one chunk,
  // which run during every step; each step shows only max(0, step - those GEMMs). 0: one collective.
  int64_t ring_steps = 0;
};

// What one stretch of code costs.
struct Costs {
  std::vector<GemmShape> gemms;
  double attention_flops = 0;     // flash attention work actually executed (causal half)
  int64_t attention_calls = 0;    // flash attention kernels (ring attention: one per K/V block)
  double memory_bytes = 0;        // bytes read and written by memory-bound kernels
  int64_t memory_kernels = 0;     // how many such kernels
  std::vector<CommOp> comms;

  void add(const Costs& other);
  double gemm_flops() const;
};

// The memory effect of one stretch of code: the change of the level from its start to its end
// (net) and its highest point above the start (peak).
struct Segment {
  int64_t net = 0;
  int64_t peak = 0;
  Costs costs;
};

class Timeline {
 public:
  using Id = int32_t;
  static constexpr Id kNone = -1;

  // Allocations are rounded up to a multiple of `granularity` bytes (the CUDA caching allocator
  // rounds to 512; the CPU counter counts exact sizes: 1).
  explicit Timeline(int64_t granularity = 1) : granularity_(granularity) {}

  // A new tensor with one owner.
  Id alloc(int64_t bytes);
  // One more owner (an autograd node saving it, a second variable).
  void hold(Id id);
  // One owner lets go; the memory is freed when none is left. kNone is ignored.
  void drop(Id id);
  int64_t bytes(Id id) const;

  int64_t level() const { return level_; }
  int64_t peak() const { return peak_; }

  // Segments: begin() starts measuring; end() returns the net change, the peak above the start
  // and the costs recorded since.
  void begin();
  Segment end();
  Costs& costs() { return costs_; }

 private:
  struct Tensor {
    int64_t bytes = 0;
    int32_t owners = 0;
  };
  std::vector<Tensor> tensors_;
  int64_t granularity_ = 1;
  int64_t level_ = 0, peak_ = 0;
  int64_t segment_start_ = 0, segment_peak_ = 0;
  Costs costs_;
};

}  // namespace trainer::counting
