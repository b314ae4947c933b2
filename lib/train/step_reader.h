#pragma once
// The step's figures stay on the device until a logged step (logging.interval, the last step) or
// a step a checkpoint follows, which reads them in one host synchronisation into
// StepEnd::reading: the step time is the average since the previous read. Every rank reads them,
// so that the divergence check (divergence_check.h) stops every rank at the same step. A
// non-finite loss or gradient norm is remembered on the device from the step it appears.
#include <ATen/core/Tensor.h>

#include <chrono>

#include "recipe/load.h"
#include "train/step_observer.h"

namespace trainer::train {

class StepReader : public StepObserver {
 public:
  // `checkpoints`: the run saves checkpoints (the figures are then also read before each save).
  StepReader(const recipe::LoadedRecipe& loaded, c10::Device device, bool checkpoints);
  void after_step(StepEnd& end) override;
  double last_loss() const { return last_loss_; }

 private:
  const recipe::Recipe& recipe_;
  const recipe::MeshShape& mesh_;
  bool checkpoints_;
  at::Tensor first_bad_loss_, first_bad_norm_;  // on the device; 0: none yet
  std::chrono::steady_clock::time_point last_read_;
  int64_t steps_since_read_ = 0, steps_timed_ = 0;
  StepTimes times_since_read_;  // summed over the steps since the last read
  double time_timed_ = 0;
  double last_loss_ = 0;
};

}  // namespace trainer::train
