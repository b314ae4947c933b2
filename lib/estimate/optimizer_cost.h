#pragma once
// What the recipe's optimizer keeps and moves per parameter (optim/update_rule.h): the state
// bytes beside the parameter (fp32 master weights when the parameters are not fp32, then the
// optimizer's own state) and the memory traffic of its step.
#include <cstdint>

#include "recipe/recipe.h"

namespace trainer::estimate {

struct OptimizerCost {
  double master_bytes = 0;   // per parameter: fp32 master weights (0 for fp32 parameters)
  double matrix_bytes = 0;   // per element of a layer matrix: the optimizer's state
  double table_bytes = 0;    // per element of the embedding and the LM head (Muon: AdamW's moments)
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
  // Muon (engine/whole_matrices.h): bytes per element of the layer matrices' shard that exist at
  // once during the step: their inputs, or the send and receive buffers of the exchange that
  // assembles them whole when they are split or sharded across ranks.
  double matrix_inputs_bytes = 0;
  double matrix_exchange_bytes = 0;
};

OptimizerCost optimizer_cost(const recipe::OptimizerConfig& optimizer, int64_t parameter_bytes);

// Muon's Newton-Schulz work per step (optim/muon_rule.h): FLOPs of optimizer.muon.ns_steps
// iterations on each layer matrix whole (4 m^2 n + 2 m^3 each, m = min(rows, cols), n = max), per
// decoder layer's attention, dense MLP, one routed expert and the shared experts; and the fp32
// temporaries of the iteration on the largest matrix (bytes).
struct MuonWork {
  double attention = 0, dense_mlp = 0, expert = 0, shared_experts = 0;
  double largest_temporaries = 0;
};
MuonWork muon_work(const recipe::Recipe& r);

}  // namespace trainer::estimate
