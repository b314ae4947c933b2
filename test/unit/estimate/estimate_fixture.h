#pragma once
// Small recipes for the estimator's unit tests, built from the shipped ones with overrides.
#include <string>
#include <vector>

#include "recipe/load.h"

namespace trainer::test {

inline std::string recipe_path(const std::string& name) { return std::string(TRAINER_SOURCE_DIR) + "/recipes/" + name; }

// Loads recipes/NAME with --set overrides at `world_size` (0: none).
inline recipe::LoadedRecipe load(const std::string& name, const std::vector<std::string>& sets = {},
                                 int64_t world_size = 0) {
  recipe::LoadOptions options;
  options.overrides = sets;
  if (world_size > 0) options.world_size = world_size;
  return recipe::load_recipe(recipe_path(name), options);
}

}  // namespace trainer::test
