#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainer::optim {

double learning_rate(const recipe::OptimizerConfig& c, int64_t total_steps, int64_t step) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  if (c.decay == recipe::LrDecay::Constant) return c.lr;
  const int64_t decay_steps = total_steps - c.warmup_steps;
  // Progress 0 at the first step after warm-up, 1 at the last step.
  const double progress =
      decay_steps <= 1 ? 1.0 : std::clamp(double(step - c.warmup_steps) / double(decay_steps - 1), 0.0, 1.0);
  if (c.decay == recipe::LrDecay::Linear) return c.lr + (c.min_lr - c.lr) * progress;
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace trainer::optim
