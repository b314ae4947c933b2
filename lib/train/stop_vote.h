#pragma once
// Stopping on SIGINT/SIGTERM, agreed by all ranks without a host synchronisation per step: each
// step every rank posts whether it was asked to stop (an asynchronous maximum over the world) and
// reads the vote it posted a step earlier. A signal during step k therefore stops every rank after
// step k + 1, all at the same step (a save then is a consistent checkpoint).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

#include "comm/communicator.h"
#include "train/step_observer.h"

namespace trainer::train {

class StopVote : public StepObserver {
 public:
  // Publishes the step a stop signal would end on from `first_step` (the step training starts
  // from) of `total_steps`.
  StopVote(comm::Communicator& world, c10::Device device, int64_t first_step, int64_t total_steps);
  ~StopVote();
  // StepEnd::stopping from the vote; a signal is acknowledged at once (by rank 0) naming the step
  // the vote will end on: one posted during step s is read at step s + 1.
  void after_step(StepEnd& end) override;

 private:
  // Reads the previous step's vote and posts this step's; true when some rank asked to stop.
  bool poll();
  void publish(int64_t step) const;

  comm::Communicator& world_;
  c10::Device device_;
  int64_t total_steps_;
  at::Tensor posted_;
  std::unique_ptr<comm::Work> work_;
};

}  // namespace trainer::train
