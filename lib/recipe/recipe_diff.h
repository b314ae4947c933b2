#pragma once
// What changed between two resolved recipes (for example a checkpoint's and the one resuming
// from it), as "path: before -> after" lines, leaves only, in document order.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainer::recipe {

std::vector<std::string> recipe_differences(const nlohmann::json& before, const nlohmann::json& after);

}  // namespace trainer::recipe
