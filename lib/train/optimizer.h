#pragma once
// The optimizer behind OptimizerDriver, chosen once when the driver is built: replicated AdamW
// (replicated_optimizer.h: ZeRO 0, or one data-parallel rank) or ZeRO-1/2/3 (zero_optimizer.h:
// the state sharded over the data-parallel ranks). Both update from the driver's gradient buckets,
// whose norm and clipping are the same for both, so only what differs is asked of them here. The
// ZeRO-3 hooks do nothing for an optimizer whose parameters are whole on every rank.
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/parameter.h"
#include "engine/zero/distributed_optimizer.h"

namespace trainer::train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of every parameter with the reduced (and clipped) gradients at learning rate lr.
  virtual void step(double lr) = 0;
  virtual int64_t steps_taken() const = 0;
  // After the parameters were set from outside (model.init_from, a checkpoint): the fp32 master
  // weights follow them.
  virtual void refresh_master_weights() = 0;
  // This rank's optimizer state for a checkpoint, without communication: live tensors, replicated
  // state marked so that one rank writes it.
  virtual std::vector<checkpoint::TensorRecord> checkpoint_records() const = 0;
  // Loads this rank's state tensor by tensor, then sets the step count.
  virtual void load_state(const engine::StateReader& read, int64_t steps_taken) = 0;
  // The run's opening line about the optimizer, given the buckets' part ("3 gradient buckets")
  // and the gradient dtype's (", bf16 gradients", or empty).
  virtual std::string describe(const std::string& buckets, const std::string& dtype) const = 0;

  // Waits for parameter all-gathers still in flight after step(): afterwards the parameters hold
  // the update (before checkpoints and exports read them).
  virtual void wait_parameter_gathers() {}
  // Seconds the last step waited for parameter all-gathers; -1 when it gathers none
  // (engine::OverlapStats::param_gather_wait_s).
  virtual double parameter_gather_wait_s() const { return -1; }

  // ZeRO-3: frees every gathered parameter (before a step, and before the update makes them stale).
  virtual void release_gathered_parameters() {}
  // ZeRO-3: after a micro-batch's backward of a model chunk (frees the chunk's units).
  virtual void end_backward(int64_t /*chunk*/) {}
  // ZeRO-3: the parameters for a checkpoint from this rank's shards; nullopt when the parameters
  // themselves are saved.
  virtual std::optional<std::vector<checkpoint::TensorRecord>> parameter_records() const { return std::nullopt; }
  // ZeRO-3: where loaded parameters go (this rank's shards); null when they go into the parameters.
  virtual std::function<void(model::Parameter&, const at::Tensor&)> parameter_writer() { return nullptr; }
};

}  // namespace trainer::train
