#pragma once
// Checkpoints as the step loop sees them. Every rank writes its part of each checkpoint (no
// collective); rank 0 commits it once all parts are durable. Asynchronous saves block training
// only until the snapshot is taken, at the latest before the next optimizer step
// (before_parameter_update), and the pause is reported then.
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint_writer.h"
#include "mesh/process_groups.h"
#include "recipe/load.h"

namespace trainer::train {

class CheckpointSaver {
 public:
  using Say = std::function<void(const std::string&)>;
  // Nothing is saved when the recipe has no checkpoint.dir.
  CheckpointSaver(const recipe::LoadedRecipe& recipe, const mesh::ProcessGroups& groups, Say say);

  bool enabled() const { return writer_ != nullptr; }
  // Reserves the snapshot buffers for content of this shape in the background.
  void reserve(checkpoint::CheckpointContent content);
  // Saves `content` of step `step`; `more_steps`: training goes on (an asynchronous save's pause is
  // then reported at the next fence()).
  void save(checkpoint::CheckpointContent content, int64_t step, const char* why, bool more_steps);
  // Before the optimizer changes parameters and state: the snapshot of a save in flight must be complete.
  void fence();
  // Reports a checkpoint committed since the last call (rank 0).
  void report_committed();
  // Waits for the save in flight; the last committed checkpoint ("" when none).
  std::string finish();

 private:
  struct Pending {
    int64_t step = 0;
    std::string why;
    double previous_s = 0;  // waiting for the previous save's write (one save in flight at a time)
    double start_s = 0;
  };
  const recipe::Recipe& recipe_;
  Say say_;
  std::unique_ptr<checkpoint::CheckpointWriter> writer_;
  std::optional<Pending> pending_;
};

}  // namespace trainer::train
