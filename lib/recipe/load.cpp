#include "recipe/load.h"

#include <fmt/format.h>

#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"
#include "core/regular_file.h"
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

// The keys that name files or directories.
const char* const kPathKeys[] = {"model.hf_config", "model.init_from", "checkpoint.dir", "checkpoint.resume",
                                 "logging.metrics_file", "logging.tensorboard_dir", "profiling.dir"};

// One rule for relative paths: relative to where they were written. A path in the recipe file is
// relative to the recipe's directory (so a recipe and its data can move together); one given with
// --set is relative to the working directory, like any path typed in a shell.
void resolve_recipe_paths(json& user, const std::string& base_dir) {
  auto resolve = [&](json& value) {
    if (!value.is_string() || value.get<std::string>().empty()) return;
    const std::filesystem::path path = value.get<std::string>();
    if (path.is_relative()) value = (std::filesystem::path(base_dir) / path).lexically_normal().string();
  };
  for (const char* key : kPathKeys) {
    json* value = const_cast<json*>(get_path(user, key));
    if (!value) continue;
    if (std::string(key) == "checkpoint.resume" && value->is_string() &&
        ResumeFrom::parse(value->get<std::string>()).mode != ResumeFrom::Mode::Path)
      continue;
    resolve(*value);
  }
  for (const char* list : {"data.paths", "evaluation.paths"})
    if (json* paths = const_cast<json*>(get_path(user, list)); paths && paths->is_array())
      for (auto& p : *paths) resolve(p);
}

// An empty string is never a path: refuse it instead of writing into the working directory.
void check_no_empty_paths(const json& resolved, std::vector<std::string>& problems) {
  for (const char* key : kPathKeys) {
    if (std::string(key) == "checkpoint.resume") continue;  // validate_recipe names its choices
    if (const json* value = get_path(resolved, key); value && value->is_string() && value->get<std::string>().empty())
      problems.push_back(fmt::format("{} is an empty string; give a path, or null for none", key));
  }
  for (const char* list : {"data.paths", "evaluation.paths"})
    if (const json* paths = get_path(resolved, list); paths && paths->is_array())
      for (size_t i = 0; i < paths->size(); ++i)
        if ((*paths)[i].is_string() && (*paths)[i].get<std::string>().empty())
          problems.push_back(fmt::format("{}[{}] is an empty string; give a path", list, i));
}

// data.paths given while data.source is left out: the user means those files, so the source is
// tokens. An explicit data.source (synthetic included) is kept, and validation names the conflict.
void infer_data_source(json& merged) {
  const json* paths = get_path(merged, "data.paths");
  if (!paths || !paths->is_array() || paths->empty() || get_path(merged, "data.source")) return;
  set_path(merged, "data.source", "tokens");
}

std::string read_text(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw UserError(fmt::format("{}: is a directory, expected a recipe file", path));
  if (!std::filesystem::exists(path)) throw UserError(fmt::format("{}: cannot open recipe file (no such file)", path));
  return read_text_file(path);  // a regular file only: a FIFO or /dev/zero would never end
}

}  // namespace

LoadedRecipe load_recipe_text(const std::string& text, const std::string& source, const std::string& base_dir,
                              const LoadOptions& options) {
  json user = parse_json_text(text, source);
  std::vector<std::string> problems;
  check_document(user, problems);
  if (!user.is_object()) throw RecipeError(source, problems);
  resolve_recipe_paths(user, base_dir);
  apply_overrides(user, options.overrides, problems);
  if (options.world_size && (*options.world_size < 1 || *options.world_size > kMaxWorldSize))
    problems.push_back(fmt::format("world size {} is not valid; expected an integer from 1 to {}", *options.world_size,
                                   kMaxWorldSize));
  if (!problems.empty()) throw RecipeError(source, problems);

  // Defaults, then the Hugging Face config, then the recipe with its overrides.
  json merged = json::object();
  std::vector<std::string> warnings;
  if (const json* hf = get_path(user, "model.hf_config"); hf && hf->is_string() && !hf->get<std::string>().empty())
    merged = read_hf_config(hf->get<std::string>(), problems, &warnings);
  merge_into(merged, user);
  infer_data_source(merged);
  json resolved = fill_defaults(merged, problems);
  check_no_empty_paths(resolved, problems);
  if (!problems.empty()) throw RecipeError(source, problems);

  LoadedRecipe loaded;
  loaded.source = source;
  loaded.warnings = std::move(warnings);
  loaded.recipe = recipe_from_json(resolved, problems);
  if (!problems.empty()) throw RecipeError(source, problems);

  std::optional<int64_t> world = options.world_size;
  if (!world && implied_world_size(loaded.recipe) > 0) world = implied_world_size(loaded.recipe);
  problems = validate_recipe(loaded.recipe, world, &loaded.warnings);
  if (!problems.empty()) throw RecipeError(source, problems);

  if (world) {
    loaded.mesh = mesh_shape(loaded.recipe, *world);
    loaded.recipe.parallel.dp = loaded.mesh->dp;
    loaded.recipe.training.global_batch_size = loaded.mesh->global_batch_size;
  }
  loaded.resolved = recipe_to_json(loaded.recipe);
  return loaded;
}

void print_warnings(const LoadedRecipe& loaded, std::FILE* out, int64_t rank) {
  for (const auto& warning : loaded.warnings)
    std::fprintf(out, "%swarning: %s\n", rank >= 0 ? fmt::format("rank {}: ", rank).c_str() : "", warning.c_str());
}

LoadedRecipe load_recipe(const std::string& path, const LoadOptions& options) {
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  return load_recipe_text(read_text(path), path, base_dir.empty() ? "." : base_dir, options);
}

}  // namespace trainer::recipe
