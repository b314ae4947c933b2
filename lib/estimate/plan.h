#pragma once
// `trainer plan`: search tp, cp, pp, vpp, ep, etp (dp follows), micro-batch size, recompute and
// ZeRO stage for the configurations of a recipe on N GPUs that fit in memory (with a margin),
// ranked by predicted tokens/s. Every configuration returned passes validate_recipe at N GPUs.
// The global batch (tokens per step) and everything outside parallel.* and the two training
// knobs stay as the recipe says.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "estimate/estimate.h"
#include "estimate/hardware.h"
#include "recipe/recipe.h"

namespace trainer::estimate {

struct PlanOptions {
  int64_t gpus = 0;
  int64_t top = 10;
  double memory_margin = 0.05;  // keep device_total_bytes <= (1 - margin) * device memory
  // Only configurations this build's `trainer run` accepts (recipe/runtime_support.h); false also
  // ranks the others, each candidate saying whether `run` accepts it.
  bool runnable_only = true;
};

struct PlanCandidate {
  recipe::Recipe recipe;           // the recipe with this configuration's parallel and training knobs
  JobEstimate estimate;
  std::vector<std::string> overrides;  // --set KEY=VALUE that turn the input recipe into this one
  bool runnable = true;                // this build's `trainer run` accepts it
};

struct PlanResult {
  std::vector<PlanCandidate> best;  // at most `top`, fastest first
  int64_t global_batch_size = 0;
  int64_t considered = 0;           // combinations enumerated
  int64_t not_runnable = 0;         // valid, but this build's `trainer run` cannot train them (skipped)
  std::string first_invalid;        // the first validation problem, when none was valid
  int64_t valid = 0;                // of which validate_recipe accepted
  int64_t fitting = 0;              // of which fit in memory
  double seconds = 0;               // search time
};

// Throws UserError when the recipe fixes a global batch no mesh of `gpus` can split, or `gpus`
// is not positive.
PlanResult plan_search(const recipe::Recipe& recipe, const HardwareProfile& gpu, const PlanOptions& options);

nlohmann::json plan_json(const PlanResult& result, const HardwareProfile& gpu, const PlanOptions& options,
                         const std::string& recipe_path);
std::string plan_text(const PlanResult& result, const HardwareProfile& gpu, const PlanOptions& options,
                      const std::string& recipe_path);

}  // namespace trainer::estimate
