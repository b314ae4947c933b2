#pragma once
// Turning a recipe file into a checked Recipe. Precedence, lowest first: schema defaults,
// model.hf_config, the recipe file, --set overrides. Every problem found is reported at once as a
// RecipeError (a UserError: exit code 2), each naming the JSON path, what was found and what is
// expected.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::recipe {

struct LoadOptions {
  std::vector<std::string> overrides;  // "KEY=VALUE" from --set, applied in order
  std::optional<int64_t> world_size;   // also check the rules that depend on the world size
};

struct LoadedRecipe {
  std::string source;       // the recipe file
  Recipe recipe;            // typed, derived fields filled in
  nlohmann::json resolved;  // the same as JSON, every key present (what `validate` prints)
  std::optional<MeshShape> mesh;  // when a world size was given or parallel.dp fixes one
};

// Reads, resolves and validates a recipe file. Throws UserError (RecipeError for recipe content).
LoadedRecipe load_recipe(const std::string& path, const LoadOptions& options = {});

// The same from text; `base_dir` resolves a relative model.hf_config.
LoadedRecipe load_recipe_text(const std::string& text, const std::string& source, const std::string& base_dir,
                              const LoadOptions& options = {});

}  // namespace trainer::recipe
