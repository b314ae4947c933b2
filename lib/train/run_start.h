#pragma once
// Where a run starts: from a checkpoint (checkpoint.resume: auto, a path, or none), from Hugging
// Face weights (model.init_from), or from the global initialisation. Says what it did, and what it
// ignored (init_from when resuming, recipe values that differ from the checkpoint's).
#include <functional>
#include <optional>
#include <string>

#include "model/transformer.h"
#include "recipe/load.h"
#include "train/optimizer_driver.h"
#include "train/trainer.h"
#include "train/training_state.h"

namespace trainer::train {

struct RunStart {
  Progress progress;
  std::optional<TrainSummary> finished;  // set when the checkpoint is already at training.steps
};

RunStart prepare_run_start(const recipe::LoadedRecipe& loaded, model::Transformer& model, OptimizerDriver& optimizer,
                           const std::function<void(const std::string&)>& say);

}  // namespace trainer::train
