#include "recipe/overrides.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"
#include "recipe/keys.h"
#include "recipe/schema.h"

namespace trainer::recipe {

void apply_overrides(nlohmann::json& recipe, const std::vector<std::string>& overrides,
                     std::vector<std::string>& problems) {
  for (const auto& text : overrides) {
    const auto equals = text.find('=');
    if (equals == std::string::npos || equals == 0) {
      problems.push_back(fmt::format("--set {}: expected KEY=VALUE, for example --set training.steps=20", text));
      continue;
    }
    const std::string path = text.substr(0, equals);
    const std::string raw = text.substr(equals + 1);
    const KeySpec* spec = find_key(path);
    if (!spec) {
      problems.push_back(fmt::format("--set {}: {}", text, unknown_key_message(path)));
      continue;
    }
    try {
      check_json_depth(raw, "--set " + path);  // before the parser, as for files
    } catch (const UserError& e) {
      problems.push_back(e.what());
      continue;
    }
    nlohmann::json value = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = raw;  // a bare word: a string
    std::vector<std::string> value_problems;
    check_tree(value, *spec, value_problems);
    if (!value_problems.empty()) {
      for (const auto& p : value_problems) problems.push_back(fmt::format("--set {}: {}", text, p));
      continue;
    }
    set_path(recipe, path, value);
  }
}

}  // namespace trainer::recipe
