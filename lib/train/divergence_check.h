#pragma once
// A non-finite loss or gradient norm at any step since the previous read stops every rank with
// the same error (TrainingFailure), naming the first such step, the quantity, and for a gradient
// norm seen at once the first parameter whose gradient is not finite. Runs after the logger, so
// that the step's line is printed first.
#include "model/transformer.h"
#include "recipe/recipe.h"
#include "train/step_observer.h"

namespace trainer::train {

class DivergenceCheck : public StepObserver {
 public:
  DivergenceCheck(const model::Transformer& model, const recipe::Recipe& recipe) : model_(model), recipe_(recipe) {}
  void after_step(StepEnd& end) override;

 private:
  const model::Transformer& model_;
  const recipe::Recipe& recipe_;
};

}  // namespace trainer::train
