#pragma once
// Cross-field rules of a recipe (types and ranges are checked against the schema before).
// Each problem names the fields, their values and a valid alternative.
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::recipe {

// The rules that hold at any world size, and with `world_size` also those that depend on it
// (mesh divisibility, batch sizes, micro-batches per pipeline). Settings that are valid but
// probably unintended (a warm-up longer than the run) are appended to `warnings` when given.
std::vector<std::string> validate_recipe(const Recipe& recipe, std::optional<int64_t> world_size,
                                         std::vector<std::string>* warnings = nullptr);

}  // namespace trainer::recipe
