#include "train/step_reader.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <vector>

#include "train/train_step.h"

namespace trainer::train {

using Clock = std::chrono::steady_clock;

StepReader::StepReader(const recipe::LoadedRecipe& loaded, c10::Device device, bool checkpoints)
    : recipe_(loaded.recipe), mesh_(loaded.mesh.value()), checkpoints_(checkpoints), last_read_(Clock::now()) {
  const auto scalar = at::TensorOptions().dtype(at::kDouble).device(device);
  first_bad_loss_ = at::zeros({}, scalar);
  first_bad_norm_ = at::zeros({}, scalar);
}

void StepReader::after_step(StepEnd& end) {
  at::NoGradGuard no_grad;
  const StepFigures& f = end.figures;
  const int64_t step = end.step;
  const at::Tensor loss = f.loss_sum / at::clamp_min(f.real_tokens, 1.0);
  // Remember the first step whose figures were not finite, without reading them.
  first_bad_loss_ = at::where((first_bad_loss_ == 0) & ~at::isfinite(loss), double(step), first_bad_loss_);
  first_bad_norm_ = at::where((first_bad_norm_ == 0) & ~at::isfinite(f.grad_norm), double(step), first_bad_norm_);
  ++steps_since_read_;
  times_since_read_ += f.times;
  const bool logged = step % recipe_.logging.interval == 0 || step == recipe_.training.steps;
  const bool read_now = end.stopping || (checkpoints_ && end.interval_save);
  if (!logged && !read_now) return;

  // The one host synchronisation of these steps.
  std::vector<at::Tensor> figures = {loss, f.aux_sum, f.grad_norm, first_bad_loss_, first_bad_norm_};
  if (f.mtp_sum.defined()) figures.push_back(f.mtp_sum / at::clamp_min(f.real_tokens, 1.0));
  const at::Tensor host = at::stack(figures).to(at::kCPU);
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - last_read_).count();
  StepReading r;
  r.seconds = elapsed / double(steps_since_read_);
  r.times = times_since_read_.scaled(1.0 / double(steps_since_read_));
  times_since_read_ = StepTimes{};
  time_timed_ += elapsed;
  steps_timed_ += steps_since_read_;
  r.mean_step_s = time_timed_ / double(std::max<int64_t>(1, steps_timed_));
  last_read_ = now;
  steps_since_read_ = 0;
  r.loss = host[0].item<double>();
  r.grad_norm = host[2].item<double>();
  // Micro-batch scope: one loss per micro-batch and dp rank; global-batch scope: one per time slot.
  const bool global_scope = recipe_.model.moe && recipe_.model.moe->aux_loss_scope == recipe::AuxLossScope::GlobalBatch;
  r.aux_loss = host[1].item<double>() / double(mesh_.grad_accum_steps * (global_scope ? 1 : mesh_.dp));
  r.first_bad_loss = host[3].item<double>();
  r.first_bad_norm = host[4].item<double>();
  const int64_t depth = recipe_.model.num_nextn_predict_layers;
  r.mtp_loss = f.mtp_sum.defined() && depth > 0 ? host[5].item<double>() / double(depth) : 0.0;
  r.logged = logged;
  last_loss_ = r.loss;
  end.reading = r;
}

}  // namespace trainer::train
