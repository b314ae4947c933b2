#pragma once
// Turning a recipe file into a checked Recipe. Precedence, lowest first: schema defaults,
// model.hf_config, the recipe file, --set overrides. Every problem found is reported at once as a
// RecipeError (a UserError: exit code 2), each naming the JSON path, what was found and what is
// expected.
#include <nlohmann/json.hpp>
#include <cstdio>
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
  // Things that are allowed but probably not meant (keys of model.hf_config that trainer ignores,
  // a warm-up longer than the run); the commands print them once, prefixed "warning: ".
  std::vector<std::string> warnings;
};

// Reads, resolves and validates a recipe file. Throws UserError (RecipeError for recipe content).
LoadedRecipe load_recipe(const std::string& path, const LoadOptions& options = {});

// Prints each of loaded.warnings as one "warning: ..." line (with "rank N: " first when rank >= 0).
void print_warnings(const LoadedRecipe& loaded, std::FILE* out, int64_t rank = -1);

// The same from text; `base_dir` is the recipe's directory, against which relative paths in the
// text resolve (paths given in overrides stay relative to the working directory).
LoadedRecipe load_recipe_text(const std::string& text, const std::string& source, const std::string& base_dir,
                              const LoadOptions& options = {});

}  // namespace trainer::recipe
