#include "train/divergence_check.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "core/error.h"

namespace trainer::train {

namespace {

std::string first_non_finite_gradient(const model::Transformer& model) {
  for (const auto& p : model.parameters().all()) {
    const at::Tensor g = p.grad();
    if (g.defined() && !at::isfinite(g).all().item<bool>()) return p.name;
  }
  return "none on this rank";
}

}  // namespace

void DivergenceCheck::after_step(StepEnd& end) {
  if (!end.reading || !end.reading->diverged()) return;
  const StepReading& r = *end.reading;
  const int64_t step = end.step;
  const bool loss_bad = r.first_bad_loss > 0 && (r.first_bad_norm == 0 || r.first_bad_loss <= r.first_bad_norm);
  const int64_t first = int64_t(loss_bad ? r.first_bad_loss : r.first_bad_norm);
  const double value = loss_bad ? r.loss : r.grad_norm;
  const std::string gradients =
      loss_bad ? ""
      : first == step ? fmt::format(" (first non-finite gradient: {})", first_non_finite_gradient(model_))
                      : "";
  throw Diverged(fmt::format(
      "step {}: the {} is {}{}{}; training diverged and stops (the last checkpoint is intact). Try a lower "
      "optimizer.lr or a longer optimizer.warmup_steps, training.grad_clip, checking the data for bad tokens{}",
      first, loss_bad ? "loss" : "gradient norm", first == step ? fmt::format("{}", value) : "not finite",
      first == step ? "" : fmt::format(" (seen at the read after step {})", step), gradients,
      recipe_.training.dtype == recipe::Precision::BF16 ? ", or training.dtype fp32 to rule out a bf16 overflow" : ""));
}

}  // namespace trainer::train
