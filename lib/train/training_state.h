#pragma once
// What a checkpoint holds for training to continue exactly: parameters and optimizer state by
// global name (with global shapes and slice offsets), the step, the data position and the RNG.
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "recipe/load.h"

namespace trainer::train {

struct Progress {
  int64_t step = 0;              // optimizer steps completed
  int64_t consumed_samples = 0;  // global samples consumed
};

checkpoint::CheckpointContent capture_training_state(model::Transformer& model, optim::AdamW& optimizer,
                                                     const recipe::LoadedRecipe& recipe, const Progress& progress);

// Loads parameters and optimizer state into the (already built) model and optimizer; returns the
// progress recorded. A tensor missing from the checkpoint, or of another global shape, is a
// UserError naming the checkpoint and the tensor.
Progress restore_training_state(const checkpoint::LoadedCheckpoint& loaded, model::Transformer& model,
                                optim::AdamW& optimizer);

}  // namespace trainer::train
