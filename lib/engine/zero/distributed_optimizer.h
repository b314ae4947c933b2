#pragma once
// ZeRO-1 (Megatron's distributed optimizer): fp32 master weights and the optimizer's state exist
// only for this rank's shard of every gradient bucket (sharded over the bucket's reduction group);
// fp32 parameters are their own master weights (the update writes their shard in place). After
// the buckets' reduce-scatter, each rank updates its shard, fragment by fragment (the part of a
// parameter inside the shard), with the optimizer's element-wise rule (optim/update_rule.h: the
// same update of every element as without sharding; 8-bit blocks cut by a shard boundary take
// their maximum from both sides, engine/block_maxima.h), and the updated parameters are
// all-gathered. The gradient norm and clipping are the buckets' (over the
// shards, each unique element counted once), so they match the unsharded optimizer.
//
// Overlapped gathers (overlap_gather, the default): step() launches every bucket's all-gather and
// returns; the next forward waits for a bucket's gather just before the first unit that uses one
// of its parameters (model::ParameterSet::before_forward), so the gathers of later layers run
// behind the computation of earlier ones (Megatron's --overlap-param-gather). Anything else that
// reads the parameters between steps (checkpoints, exports) calls wait_gathers() first.
//
// ZeRO-3 (a Zero3Options given): the parameters are gathered unit by unit where they are used
// (zero3_gathers.h); the step only writes the updated shard, and checkpoints take the parameters
// from the shards (parameter_records) without gathering them.
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/block_maxima.h"
#include "engine/whole_matrices.h"
#include "optim/update_rule.h"
#include "engine/grad_buckets.h"
#include "engine/zero/zero3_gathers.h"
#include "recipe/recipe.h"

namespace trainer::engine {

// Reads the slice [offsets, offsets + shape) of a checkpointed tensor by global name, or nothing
// when the checkpoint does not have it and need not (fp32 master weights of an fp32 checkpoint:
// taken from the parameters); missing required state is the reader's error. Loading goes tensor by tensor through it, so a rank never
// holds more of the checkpoint than one parameter's state at a time.
using StateReader = std::function<std::optional<at::Tensor>(const std::string& name, const std::vector<int64_t>& offsets,
                                                            const std::vector<int64_t>& shape)>;

class DistributedOptimizer {
 public:
  DistributedOptimizer(GradBuckets& buckets, model::ParameterSet& params, const recipe::OptimizerConfig& config,
                       bool overlap_gather, const std::optional<Zero3Options>& zero3 = std::nullopt);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Updates this rank's shard and all-gathers the parameters: waits for the gathers unless they
  // overlap the next forward.
  void step(double lr);
  // Waits for every all-gather still in flight: afterwards the parameters hold the updated values.
  void wait_gathers();
  // Seconds the last step spent waiting for parameter gathers (their exposed time): overlapped, the
  // waits of its forward for the previous update's gathers; otherwise the wait in step().
  double gather_wait_s() const { return last_gather_wait_s_; }
  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  // Copies this rank's shard of the parameters into the fp32 master weights (after loading them;
  // under ZeRO-3 before the first step, while the parameters are still whole).
  void refresh_master_weights();
  // ZeRO-3: writes a parameter's local slice (without padding rows, as checkpoints hold it) into
  // this rank's shard; refresh_master_weights() after the last one.
  void load_parameter(const model::Parameter& p, const at::Tensor& real_slice);
  // ZeRO-3, or null: where parameters are gathered and released.
  Zero3Gathers* zero3_gathers() { return zero3_gathers_.get(); }
  const Zero3Gathers* zero3_gathers() const { return zero3_gathers_.get(); }
  // ZeRO-3: this rank's part of the parameters for a checkpoint, as flat ranges of each
  // parameter's slice (names and layout as the whole parameters would be saved), taken from the
  // shards without communication. The live tensors.
  std::vector<checkpoint::TensorRecord> parameter_records() const;

  // This rank's state for a checkpoint, under the names optim::LocalOptimizer::state() uses, without any
  // communication: its fragments of the state (and of the fp32 master weights when the parameters
  // are not fp32) as flat ranges of each parameter's slice (per-block state: of its block layout,
  // optim/state_layout.h), and the step counts (replicated). The live tensors.
  std::vector<checkpoint::TensorRecord> checkpoint_records() const;
  // Loads this rank's fragments (and the step counts) by the same names; missing master weights
  // (a checkpoint of an fp32 run) are taken from the parameters.
  void load_state(const StateReader& read);
  const optim::UpdateRule& rule() const { return *rule_; }

 private:
  struct Fragment {
    size_t bucket, param;
    int64_t param_offset;   // first element within the parameter
    int64_t shard_offset;   // first element within this rank's shard of the bucket
    int64_t length;
  };

  void wait_unit(int64_t unit);
  // Waits for bucket's all-gather if one is in flight; returns the seconds waited.
  double finish_gather(size_t bucket);

  // The records of each fragment of `buffers` (one per bucket) under `prefix` + the parameter's name.
  void add_fragment_records(const std::string& prefix, const std::vector<at::Tensor>& buffers,
                            std::vector<checkpoint::TensorRecord>& out) const;
  // Who else holds fragment f's state (the same slice and shard).
  checkpoint::TensorRecord::Replication fragment_holders(const Fragment& fr) const;

  GradBuckets& buckets_;
  model::ParameterSet& set_;
  std::unique_ptr<Zero3Gathers> zero3_gathers_;
  std::deque<model::Parameter>& params_;
  bool overlap_gather_;
  std::vector<std::unique_ptr<comm::Work>> gathers_;  // per bucket: its all-gather in flight, or null
  std::vector<std::vector<size_t>> unit_buckets_;     // per forward unit: the buckets holding its parameters
  double gather_wait_s_ = 0;       // accumulating since the last step()
  double last_gather_wait_s_ = 0;
  recipe::OptimizerConfig config_;
  std::unique_ptr<optim::UpdateRule> rule_;
  std::vector<Fragment> fragments_;
  std::vector<optim::PieceGeometry> geometry_;     // per fragment
  std::vector<std::vector<at::Tensor>> states_;    // per fragment: the rule's state
  // Per bucket: the fp32 master shard (fp32 parameters: their shard of the storage itself).
  std::vector<at::Tensor> masters_;
  std::vector<at::Tensor> steps_;                  // per fragment (the fused kernel wants one per tensor)
  std::unique_ptr<CutBlocks> cut_blocks_;          // blockwise rules: blocks cut by shard boundaries
  std::unique_ptr<WholeMatrices> whole_matrices_;  // whole-matrix rules (Muon): their exchange
  int64_t steps_taken_ = 0;
};

}  // namespace trainer::engine
