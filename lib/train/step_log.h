#pragma once
// What the run tells its user (rank 0): the opening lines (model, data, mesh, optimizer), one
// console line and one metrics-file record per logged step (from the figures step_reader.h read),
// the estimator's prediction beside the first measurement, and evaluation results.
#include <c10/core/Device.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "data/dataset.h"
#include "estimate/estimate.h"
#include "metrics/tensorboard_writer.h"
#include "estimate/model_counts.h"
#include "metrics/metrics_file.h"
#include "metrics/step_metrics.h"
#include "model/transformer.h"
#include "recipe/load.h"
#include "train/evaluation.h"
#include "train/step_observer.h"
#include "train/train_step.h"

namespace trainer::train {

class StepLog : public StepObserver {
 public:
  // `log` null: this rank prints nothing (every rank but 0).
  StepLog(const recipe::LoadedRecipe& loaded, c10::Device device, FILE* log);

  void say(const std::string& line) const;
  void print_opening(const data::Dataset& dataset, const std::string& optimizer_description);
  // Prints the step's line at logged steps (and a diverged step's before the check stops the run).
  void after_step(StepEnd& end) override;
  void evaluation(int64_t step, const EvaluationResult& result);

 private:
  // The MoE load figures into `extra` (per layer: tokens per expert, max/mean, coefficient of
  // variation; the smallest top-k margin; the z-loss) and a console summary of the worst layer.
  std::string moe_statistics(const StepFigures& f, nlohmann::json* extra) const;
  // The metrics record of a logged step (the console line, the metrics file, TensorBoard).
  metrics::StepMetrics step_metrics(const StepEnd& end, const StepReading& reading) const;
  void print_step(const StepEnd& end, const StepReading& reading);

  const recipe::LoadedRecipe& loaded_;
  const recipe::Recipe& recipe_;
  const recipe::MeshShape& mesh_;
  c10::Device device_;
  FILE* log_;
  estimate::ModelCounts counts_;
  estimate::JobEstimate predicted_;
  std::optional<double> peak_tflops_;
  std::string device_name_ = "CPU";
  std::unique_ptr<metrics::MetricsFile> metrics_file_;
  std::unique_ptr<metrics::TensorBoardWriter> tensorboard_;
  std::optional<double> floor_;
  std::chrono::steady_clock::time_point run_start_;
  bool compared_ = false;
};

}  // namespace trainer::train
