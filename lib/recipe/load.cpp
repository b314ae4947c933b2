#include "recipe/load.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/json_file.h"
#include "recipe/hf_config.h"
#include "recipe/keys.h"
#include "recipe/overrides.h"
#include "recipe/recipe_json.h"
#include "recipe/schema.h"
#include "recipe/validate.h"

namespace trainer::recipe {

namespace {

using nlohmann::json;

// Deep merge: `top` wins; objects merge key by key; null in `top` replaces (an explicit null).
void merge_into(json& base, const json& top) {
  if (!base.is_object() || !top.is_object()) {
    base = top;
    return;
  }
  for (const auto& [name, value] : top.items()) {
    if (value.is_object() && base.contains(name) && base[name].is_object())
      merge_into(base[name], value);
    else
      base[name] = value;
  }
}

// Every key of the schema, taken from `merged` or from its default. Sections that are null
// (model.moe, model.rope_scaling) contribute no members; missing required keys are problems.
json fill_defaults(const json& merged, std::vector<std::string>& problems) {
  json resolved = json::object();
  for (const auto& spec : schema()) {
    // Skip members of a section that is absent-and-null or explicitly null.
    const auto dot = spec.path.rfind('.');
    if (dot != std::string::npos) {
      const json* parent = get_path(resolved, spec.path.substr(0, dot));
      if (!parent || parent->is_null()) continue;
    }
    const json* given = get_path(merged, spec.path);
    if (spec.kind == ValueKind::Section) {
      const bool present = given && given->is_object();
      set_path(resolved, spec.path, present ? json::object() : spec.default_value);
      continue;
    }
    if (given) {
      set_path(resolved, spec.path, *given);
    } else if (spec.required) {
      problems.push_back(fmt::format("missing required key {} ({}): {}", spec.path, describe_expected(spec), spec.doc));
    } else {
      set_path(resolved, spec.path, spec.default_value);
    }
  }
  return resolved;
}

std::string read_text(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw UserError(fmt::format("{}: is a directory, expected a recipe file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(fmt::format("{}: cannot open recipe file", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

LoadedRecipe load_recipe_text(const std::string& text, const std::string& source, const std::string& base_dir,
                              const LoadOptions& options) {
  json user = parse_json_text(text, source);
  std::vector<std::string> problems;
  check_document(user, problems);
  if (!user.is_object()) throw RecipeError(source, problems);
  apply_overrides(user, options.overrides, problems);
  if (options.world_size && (*options.world_size < 1 || *options.world_size > kMaxWorldSize))
    problems.push_back(fmt::format("world size {} is not valid; expected an integer from 1 to {}", *options.world_size,
                                   kMaxWorldSize));
  if (!problems.empty()) throw RecipeError(source, problems);

  // Defaults, then the Hugging Face config, then the recipe with its overrides.
  json merged = json::object();
  if (const json* hf = get_path(user, "model.hf_config"); hf && hf->is_string()) {
    std::filesystem::path hf_path = hf->get<std::string>();
    if (hf_path.is_relative()) hf_path = std::filesystem::path(base_dir) / hf_path;
    merged = read_hf_config(hf_path.lexically_normal().string(), problems);
  }
  merge_into(merged, user);
  json resolved = fill_defaults(merged, problems);
  if (!problems.empty()) throw RecipeError(source, problems);

  LoadedRecipe loaded;
  loaded.source = source;
  loaded.recipe = recipe_from_json(resolved, problems);
  if (!problems.empty()) throw RecipeError(source, problems);

  std::optional<int64_t> world = options.world_size;
  if (!world && implied_world_size(loaded.recipe) > 0) world = implied_world_size(loaded.recipe);
  problems = validate_recipe(loaded.recipe, world);
  if (!problems.empty()) throw RecipeError(source, problems);

  if (world) {
    loaded.mesh = mesh_shape(loaded.recipe, *world);
    loaded.recipe.parallel.dp = loaded.mesh->dp;
    loaded.recipe.training.global_batch_size = loaded.mesh->global_batch_size;
  }
  loaded.resolved = recipe_to_json(loaded.recipe);
  return loaded;
}

LoadedRecipe load_recipe(const std::string& path, const LoadOptions& options) {
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return load_recipe_text(read_text(path), path, base_dir.empty() ? "." : base_dir, options);
}

}  // namespace trainer::recipe
