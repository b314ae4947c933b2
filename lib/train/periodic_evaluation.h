#pragma once
// evaluation.interval: the held-out loss every this many steps, after the last step and before a
// stop on a signal (evaluation.h), printed and recorded by the logger; the latest result goes into
// every checkpoint saved after it.
#include <memory>
#include <optional>

#include "train/evaluation.h"
#include "train/step_log.h"
#include "train/step_observer.h"

namespace trainer::train {

class PeriodicEvaluation : public StepObserver {
 public:
  // `held_out` null: evaluation is off (evaluation.interval 0).
  PeriodicEvaluation(const model::Transformer& model, const data::Dataset* held_out, const recipe::LoadedRecipe& loaded,
                     const mesh::ProcessGroups& groups, const PipelinePlan& pipeline, c10::Device device, StepLog& log)
      : model_(model), held_out_(held_out), loaded_(loaded), groups_(groups), pipeline_(pipeline), device_(device),
        log_(log) {}
  void after_step(StepEnd& end) override;
  const std::optional<EvaluationResult>& last() const { return last_; }

 private:
  const model::Transformer& model_;
  const data::Dataset* held_out_;
  const recipe::LoadedRecipe& loaded_;
  const mesh::ProcessGroups& groups_;
  const PipelinePlan& pipeline_;
  c10::Device device_;
  StepLog& log_;
  std::optional<EvaluationResult> last_;
};

}  // namespace trainer::train
