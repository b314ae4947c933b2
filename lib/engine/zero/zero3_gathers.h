#pragma once
// ZeRO-3 (fully sharded data parallelism): each rank keeps only its shard of every parameter
// bucket; a forward unit's parameters (model::Parameter::unit: the embedding, one decoder layer,
// the final norm and LM head) exist in full only around their use. GradBuckets builds the buckets
// per unit under ZeRO-3, so a unit's parameters are the buckets it owns.
//
// Forward: before a unit, its buckets are all-gathered (if not already) and the next unit's
// gathers are issued at once (one unit prefetched), then waited for; after it, with
// reshard_after_forward, the gathered storage is freed. Backward: before a unit's backward (its
// output's hook, model::ParameterSet::mark_unit_output) it is gathered again with the previous
// unit prefetched, and the unit after it, whose backward is done, is freed (and at the end of each
// micro-batch's backward whatever of the chunk is left), unless reshard_after_backward is off
// (pipeline parallelism: kept for the step's other micro-batches). The embedding is not gathered
// for its backward (which reads no weight). The LM head unit is not freed after its forward when
// its backward may follow at once (its loss carries the hook for when it does not); buckets
// holding a weight used by two units (an embedding tied to the LM head on the same stage) stay
// gathered from their first use to the end of the step. Gradients are reduce-scattered by the ZeRO-2 machinery as each bucket's last
// contribution arrives.
//
// Freeing keeps the tensors: the parameters stay views of their bucket's buffer, whose storage is
// given back to the allocator and allocated again for the next gather (FSDP1's approach), so every
// layer, autograd's saved weights included, sees the gathered values without knowing about ZeRO.
// Gathers on a bucket's communicator are issued at the same unit boundaries on every rank, in
// the same order.
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <vector>

#include "engine/grad_buckets.h"

namespace trainer::engine {

struct Zero3Options {
  bool reshard_after_forward = true;
  bool reshard_after_backward = true;
  int64_t head_unit = -1;  // the final norm and LM head's unit (model::Transformer::head_unit)
  int64_t embedding_unit = 0;
  // The schedule defers weight gradients (zero-bubble's W): the head's recomputes its logits from
  // the head's weight, so the head stays gathered until the step's gradients are finished.
  bool keep_head = false;
};

class Zero3Gathers {
 public:
  // Every bucket starts released (GradBuckets keeps only the shards under ZeRO-3).
  Zero3Gathers(GradBuckets& buckets, model::ParameterSet& set, const Zero3Options& options);
  ~Zero3Gathers();
  Zero3Gathers(const Zero3Gathers&) = delete;
  Zero3Gathers& operator=(const Zero3Gathers&) = delete;

  // This rank's shard of a bucket's parameters in the model dtype, the input of its all-gathers:
  // the optimizer writes each update here.
  at::Tensor& shard(size_t bucket) { return buckets_.buckets()[bucket].shard_values; }
  // Waits for every gather in flight and frees every bucket's full values.
  void release_all();
  // After a micro-batch's backward of a model chunk: frees the chunk's units (reshard_after_backward).
  void end_backward(int64_t chunk);
  // Seconds spent waiting for gathers since the last call.
  double take_wait_s();

 private:
  enum class State { Released, Gathering, Gathered, Whole };  // Whole: a one-rank group's bucket
  struct Slot {
    State state = State::Released;
    std::unique_ptr<comm::Work> work;
    bool pinned = false;  // holds a weight two units use: released by release_all() only
  };
  void gather(int64_t unit);
  void wait(int64_t unit);
  void release(int64_t unit);
  void wait_slot(size_t bucket);
  // The unit this rank holds after (+1) or before (-1) `unit` in model order, or -1.
  int64_t neighbour(int64_t unit, int direction) const;

  void before_forward(int64_t unit);
  void after_forward(int64_t unit);
  void before_backward(int64_t unit);
  bool same_chunk(int64_t a, int64_t b) const;
  bool releasable_after_backward(int64_t unit) const;

  GradBuckets& buckets_;
  model::ParameterSet& set_;
  Zero3Options options_;
  std::vector<Slot> slots_;
  std::map<int64_t, std::vector<size_t>> unit_buckets_;  // per unit: its buckets
  std::map<int64_t, std::vector<int64_t>> chunk_units_;  // per model chunk: its units
  double wait_s_ = 0;
};

}  // namespace trainer::engine
