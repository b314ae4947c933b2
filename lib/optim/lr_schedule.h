#pragma once
// The learning rate of each optimizer step: linear warm-up from lr/warmup_steps to lr over
// warmup_steps, then cosine, linear or no decay to min_lr at the last step. Torch-free.
#include <cstdint>

#include "recipe/recipe.h"

namespace trainer::optim {

// Learning rate for optimizer step `step` (0-based) of `total_steps`.
double learning_rate(const recipe::OptimizerConfig& config, int64_t total_steps, int64_t step);

}  // namespace trainer::optim
