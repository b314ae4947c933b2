#pragma once
// The step loop (trainer.cpp) runs compute -> clip -> update, then hands the finished step to a
// list of observers, in order: the routing-bias update, the stop vote, the figure reader, the
// straggler watch, the logger, the divergence check, evaluation, checkpointing, profiling. Each is
// one file; each may leave something in StepEnd for the ones after it (the stop vote: `stopping`;
// the reader: `reading`; the straggler watch: `straggler`; checkpointing: `stop`, which ends the
// loop and skips the rest).
#include <cstdint>
#include <optional>

#include "train/step_times.h"

namespace trainer::engine {
struct OverlapStats;
}

namespace trainer::train {

struct StepFigures;
struct StragglerReport;

// The step's figures read to the host (step_reader.h), at logged steps and before a checkpoint.
struct StepReading {
  double loss = 0, aux_loss = 0, grad_norm = 0;
  double mtp_loss = 0;  // the multi-token prediction modules' mean cross-entropy (0 without MTP)
  double seconds = 0;          // wall time per step since the previous read
  double mean_step_s = 0;      // wall time per step since the start of the run (for the ETA)
  double first_bad_loss = 0;   // first step whose loss was not finite since the start (0: none)
  double first_bad_norm = 0;   // the same for the gradient norm
  StepTimes times;             // the steps' breakdown since the previous read, per step
  bool logged = false;         // a logging.interval step (or the last one)
  bool diverged() const { return first_bad_loss > 0 || first_bad_norm > 0; }
};

struct StepEnd {
  int64_t step = 0;  // the optimizer step just finished, 1-based
  double lr = 0;
  const StepFigures& figures;
  const engine::OverlapStats* overlap = nullptr;  // the data-parallel overlap of this step, if any
  bool last = false;           // training.steps reached
  bool interval_save = false;  // checkpoint.interval falls on this step
  bool stopping = false;       // set by the stop vote: every rank stops after this step
  std::optional<StepReading> reading;  // set by the reader when it read the figures
  const StragglerReport* straggler = nullptr;  // set by the straggler watch at logged steps, when on
  bool stop = false;           // set by checkpointing after the stop save: the loop ends here
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Before the forward of step `step` (1-based).
  virtual void before_step(int64_t /*step*/) {}
  virtual void after_step(StepEnd& end) = 0;
  // After every observer's after_step (when the loop goes on).
  virtual void end_of_step(const StepEnd& /*end*/) {}
};

}  // namespace trainer::train
