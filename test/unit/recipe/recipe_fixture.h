#pragma once
// A small valid recipe and helpers to load it with overrides, shared by the recipe tests.
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "recipe/load.h"

namespace trainer::test {

inline const char* kBaseRecipe = R"({
  "model": {"vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
            "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096},
  "training": {"seq_len": 256, "micro_batch_size": 2, "global_batch_size": 32, "steps": 100}
})";

inline recipe::LoadedRecipe load_base(const std::vector<std::string>& overrides = {},
                                      std::optional<int64_t> world_size = std::nullopt,
                                      const std::string& text = kBaseRecipe) {
  recipe::LoadOptions options;
  options.overrides = overrides;
  options.world_size = world_size;
  return recipe::load_recipe_text(text, "r.json", ".", options);
}

// The problems a recipe has (empty when it is valid). Anything but a UserError propagates.
inline std::vector<std::string> problems_of(const std::vector<std::string>& overrides,
                                            std::optional<int64_t> world_size = std::nullopt,
                                            const std::string& text = kBaseRecipe) {
  try {
    load_base(overrides, world_size, text);
  } catch (const RecipeError& e) {
    return e.problems();
  } catch (const UserError& e) {
    return {e.what()};
  }
  return {};
}

inline bool any_contains(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace trainer::test
