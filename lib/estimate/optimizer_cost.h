#pragma once
// What the recipe's optimizer keeps and moves per parameter (optim/update_rule.h): the state
// bytes beside the parameter (fp32 master weights when the parameters are not fp32, then the
// optimizer's own state) and the memory traffic of its step.
#include <cstdint>

#include "recipe/recipe.h"

namespace trainer::estimate {

struct OptimizerCost {
  double master_bytes = 0;   // per parameter: fp32 master weights (0 for fp32 parameters)
  double matrix_bytes = 0;   // per element of a matrix: the optimizer's state
  double vector_bytes = 0;   // per element of a norm weight or bias (8-bit AdamW keeps them fp32)
  double step_bytes = 0;     // memory traffic of the step per parameter (read + written)
  // Bytes of fp32 temporaries per element that exist for a slice of the update (bf16 moments
  // widened; 8-bit runs of optim::AdamW8bitRule::kRunElements), and the cap on the elements they
  // cover at once (0: none).
  double transient_bytes_per_element = 0;
  double transient_elements_cap = 0;
  bool transient_per_tensor = false;  // the temporaries cover one tensor (8-bit runs), not a slice of many
  // 8-bit AdamW over rows of a multiple of 256 columns (whole flat blocks, no per-element block index).
  double transient_bytes_whole_blocks = 0;
};

OptimizerCost optimizer_cost(const recipe::OptimizerConfig& optimizer, int64_t parameter_bytes);

}  // namespace trainer::estimate
