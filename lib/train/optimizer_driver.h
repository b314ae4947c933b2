#pragma once
// The optimizer as the training loop sees it: replicated AdamW (ZeRO 0, or one data-parallel
// rank) or the ZeRO-1 distributed optimizer; with several data-parallel ranks, gradients are
// reduced by the buckets before any of this runs.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "parallel/data/distributed_optimizer.h"
#include "parallel/data/grad_buckets.h"

namespace trainer::train {

class OptimizerDriver {
 public:
  OptimizerDriver(model::Transformer& model, const recipe::Recipe& recipe, comm::Communicator& dp);

  // Called around each micro-batch's backward and after the last one.
  void begin_step();
  void begin_micro_batch(bool last);
  void end_micro_batch();
  void finish_gradients();  // waits for the data-parallel reductions

  double grad_norm();
  void clip(double max_norm, double norm);
  void step(double lr);
  void zero_grad();
  int64_t steps_taken() const;

  // This rank's optimizer state for a checkpoint (no communication): ZeRO-1 fragments as flat
  // ranges, replicated state marked so that one data-parallel rank writes it. Live tensors.
  std::vector<checkpoint::TensorRecord> checkpoint_records() const;
  // Loads this rank's state (its ZeRO-1 fragments, or all of it) tensor by tensor.
  void load_state(const parallel::StateReader& read, int64_t steps_taken);

  const parallel::OverlapStats* overlap() const { return buckets_ ? &buckets_->stats() : nullptr; }
  std::string describe() const;

 private:
  model::Transformer& model_;
  std::unique_ptr<parallel::GradBuckets> buckets_;
  std::unique_ptr<optim::AdamW> adamw_;
  std::unique_ptr<parallel::DistributedOptimizer> zero1_;
};

}  // namespace trainer::train
