#pragma once
// Conversion between a resolved recipe document (every key present, types checked) and Recipe.
#include <nlohmann/json.hpp>

#include "recipe/recipe.h"

namespace trainer::recipe {

// Builds the typed recipe and fills derived fields. Problems in the derivation (for example a
// hidden_size that heads do not divide when head_dim is not given) are appended.
Recipe recipe_from_json(const nlohmann::json& resolved, std::vector<std::string>& problems);

// Every schema key, with derived values written out.
nlohmann::json recipe_to_json(const Recipe& recipe);

}  // namespace trainer::recipe
