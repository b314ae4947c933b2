#pragma once
// The training loop of one process: gradient accumulation up to the global batch, loss normalised
// by the global token count, AdamW with warm-up and decay, global grad-norm clipping, metrics,
// checkpoints, resume, and a clean stop on SIGINT/SIGTERM. Non-finite loss or gradients stop the
// run with an error naming the step and the quantity.
#include <cstdio>
#include <memory>
#include <string>

#include "recipe/load.h"

namespace trainer::train {

struct TrainSummary {
  int64_t first_step = 0;          // the step training started from (after resume)
  int64_t steps_completed = 0;     // optimizer steps done in total (including before a resume)
  bool stopped_by_signal = false;
  double last_loss = 0;
  std::string last_checkpoint;     // "" when none was written
};

struct TrainOptions {
  FILE* log = stdout;   // where the console lines go (rank 0)
  bool force_cpu = false;
};

// Runs training to recipe.training.steps (or until a stop signal). Throws UserError for bad input
// (data files, checkpoints) and std::runtime_error for failures (divergence, I/O).
TrainSummary train(const recipe::LoadedRecipe& recipe, const TrainOptions& options = {});

}  // namespace trainer::train
