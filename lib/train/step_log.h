#pragma once
// What the run tells its user (rank 0): the opening lines (model, data, mesh, optimizer), one
// console line and one metrics-file record per logged step, the estimator's prediction beside the
// first measurement, and evaluation results. The step's figures stay on the device until a logged
// step (or a step a checkpoint follows), which reads them in one host synchronisation: the step
// time is the average since the previous read. Every rank reads them, and a non-finite loss or
// gradient norm at any step since the previous read stops every rank with the same error.
#include <ATen/core/Tensor.h>
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
#include "model/transformer.h"
#include "parallel/data/grad_buckets.h"
#include "recipe/load.h"
#include "train/evaluation.h"
#include "train/train_step.h"

namespace trainer::train {

class StepLog {
 public:
  // `log` null: this rank prints nothing (every rank but 0).
  StepLog(const recipe::LoadedRecipe& loaded, const model::Transformer& model, c10::Device device, FILE* log);

  void say(const std::string& line) const;
  void print_opening(const data::Dataset& dataset, const std::string& optimizer_description);
  // After each optimizer step (`step`: the 1-based number of the step just finished). Reads the
  // figures at logged steps, the last step and when `read_now` (a checkpoint follows).
  void after_step(int64_t step, double lr, const StepFigures& figures, const parallel::OverlapStats* overlap,
                  bool read_now);
  void evaluation(int64_t step, const EvaluationResult& result);
  double last_loss() const { return last_loss_; }

 private:
  void check_finite(int64_t step, double loss, double grad_norm, double first_bad_loss, double first_bad_norm) const;
  // The MoE load figures into `extra` (per layer: tokens per expert, max/mean, coefficient of
  // variation; the smallest top-k margin; the z-loss) and a console summary of the worst layer.
  std::string moe_statistics(const StepFigures& f, nlohmann::json* extra) const;
  void print_step(int64_t step, double lr, double loss, double aux, double grad_norm, double seconds,
                  const parallel::OverlapStats* overlap,
                  const StepFigures& figures);

  const recipe::LoadedRecipe& loaded_;
  const recipe::Recipe& recipe_;
  const recipe::MeshShape& mesh_;
  const model::Transformer& model_;
  c10::Device device_;
  FILE* log_;
  estimate::ModelCounts counts_;
  estimate::JobEstimate predicted_;
  std::optional<double> peak_tflops_;
  std::string device_name_ = "CPU";
  std::unique_ptr<metrics::MetricsFile> metrics_file_;
  std::unique_ptr<metrics::TensorBoardWriter> tensorboard_;
  std::optional<double> floor_;
  // First step with a non-finite loss / gradient norm since the start (0: none), on the device.
  at::Tensor first_bad_loss_, first_bad_norm_;
  std::chrono::steady_clock::time_point run_start_, last_read_;
  int64_t steps_since_read_ = 0, steps_timed_ = 0;
  StepTimes times_since_read_;  // summed over the steps since the last read
  StepTimes logged_times_;      // their average per step, for the line being written
  double time_timed_ = 0;
  bool compared_ = false;
  double last_loss_ = 0;
};

}  // namespace trainer::train
