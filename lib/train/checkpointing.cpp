#include "train/checkpointing.h"

#include <fmt/format.h>

#include "core/error.h"

namespace trainer::train {

Checkpointing::Checkpointing(const recipe::LoadedRecipe& loaded, const mesh::ProcessGroups& groups,
                             CheckpointSaver::Say say, Content content, const checkpoint::DirClaim* claim,
                             const std::atomic<int64_t>& wait_ns)
    : recipe_(loaded.recipe),
      say_(say),
      saver_(loaded, groups, say),
      content_(std::move(content)),
      claim_(claim),
      wait_ns_(wait_ns) {
  saver_.reserve(content_());
}

StepTimes Checkpointing::take_time() {
  StepTimes t = saving_;
  saving_ = StepTimes{};
  return t;
}

void Checkpointing::after_step(StepEnd& end) {
  if (claim_ && claim_->lost())
    throw TrainingFailure(fmt::format("checkpoint.dir {} was taken over by {}; this job stops without writing "
                                      "another checkpoint",
                                      *recipe_.checkpoint.dir, claim_->lost_to()));
  if (end.stopping) {
    say_(fmt::format("stopping after step {} on a signal", end.step));
    saver_.save(content_(), end.step, "on stop", false);
    end.stop = true;
    return;
  }
  PhaseClock phase(wait_ns_);
  if (end.last)
    saver_.save(content_(), end.step, "final", false);
  else if (end.interval_save)
    saver_.save(content_(), end.step, "interval", true);
  phase.lap(&saving_.checkpoint_s, &saving_.comm_wait_s);
}

void Checkpointing::end_of_step(const StepEnd&) { saver_.report_committed(); }

}  // namespace trainer::train
