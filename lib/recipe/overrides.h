#pragma once
// --set KEY=VALUE: VALUE is read as JSON when it parses as JSON (numbers, true, null, lists,
// objects, "quoted strings") and as a plain string otherwise, then type-checked like a recipe value.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainer::recipe {

// Applies overrides to a recipe's JSON, creating sections as needed. Problems (unknown key,
// wrong type, malformed KEY=VALUE) are appended to `problems`.
void apply_overrides(nlohmann::json& recipe, const std::vector<std::string>& overrides,
                     std::vector<std::string>& problems);

}  // namespace trainer::recipe
