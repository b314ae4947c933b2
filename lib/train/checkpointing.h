#pragma once
// Checkpoints in the step loop: saves at checkpoint.interval, after the last step, and after the
// step a stop signal ends on (then the loop ends: StepEnd::stop), each of the state `content`
// returns (the live tensors, captured after the parameter gathers of the step's update). The time
// spent saving is counted in the next step's figures (take_time). Rank 0 stops the run when its
// claim on checkpoint.dir was taken over by another job.
#include <atomic>
#include <functional>
#include <string>

#include "checkpoint/dir_claim.h"
#include "train/checkpoint_saver.h"
#include "train/step_observer.h"

namespace trainer::train {

class Checkpointing : public StepObserver {
 public:
  using Content = std::function<checkpoint::CheckpointContent()>;
  // `claim`: rank 0's claim on checkpoint.dir, or null. `wait_ns`: the communicators' collective
  // wait counter (step_times.h).
  Checkpointing(const recipe::LoadedRecipe& loaded, const mesh::ProcessGroups& groups, CheckpointSaver::Say say,
                Content content, const checkpoint::DirClaim* claim, const std::atomic<int64_t>& wait_ns);

  bool enabled() const { return saver_.enabled(); }
  // Before the optimizer changes parameters: the snapshot of a save in flight must be complete.
  void fence() { saver_.fence(); }
  // The time spent saving after the previous step (once).
  StepTimes take_time();
  void after_step(StepEnd& end) override;
  // Reports the checkpoints committed since the last call (rank 0).
  void end_of_step(const StepEnd& end) override;
  // Waits for the save in flight; the last committed checkpoint ("" when none).
  std::string finish() { return saver_.finish(); }

 private:
  const recipe::Recipe& recipe_;
  CheckpointSaver::Say say_;
  CheckpointSaver saver_;
  Content content_;
  const checkpoint::DirClaim* claim_;
  const std::atomic<int64_t>& wait_ns_;
  StepTimes saving_;
};

}  // namespace trainer::train
