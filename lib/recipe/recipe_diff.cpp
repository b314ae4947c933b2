#include "recipe/recipe_diff.h"

#include <fmt/format.h>

namespace trainer::recipe {

namespace {

void collect(const nlohmann::json& before, const nlohmann::json& after, const std::string& path,
             std::vector<std::string>& out) {
  if (before.is_object() && after.is_object()) {
    for (const auto& [key, value] : before.items()) {
      const std::string child = path.empty() ? key : path + "." + key;
      collect(value, after.contains(key) ? after[key] : nlohmann::json(), child, out);
    }
    for (const auto& [key, value] : after.items())
      if (!before.contains(key)) collect(nlohmann::json(), value, path.empty() ? key : path + "." + key, out);
    return;
  }
  if (before != after) out.push_back(fmt::format("{}: {} -> {}", path, before.dump(), after.dump()));
}

}  // namespace

std::vector<std::string> recipe_differences(const nlohmann::json& before, const nlohmann::json& after) {
  std::vector<std::string> out;
  collect(before, after, "", out);
  return out;
}

}  // namespace trainer::recipe
