#include "recipe/keys.h"

#include <fmt/format.h>

#include "core/nearest.h"

namespace trainer::recipe {

namespace {

std::string parent_of(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

std::string last_part(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

}  // namespace

std::string unknown_key_message(const std::string& path) {
  const std::string section = parent_of(path);
  const std::string name = last_part(path);
  // A key of the right name in another section ("training.lr" for "optimizer.lr").
  for (const auto& spec : schema())
    if (last_part(spec.path) == name && spec.path != path)
      return fmt::format("unknown key {}; did you mean {}?", path, spec.path);
  std::vector<std::string> names;
  for (const auto& member : member_paths(section)) names.push_back(last_part(member));
  if (names.empty()) {
    // The section itself is unknown (for example "modle.hidden_size"): suggest a section.
    std::vector<std::string> all;
    for (const auto& spec : schema()) all.push_back(spec.path);
    const std::string guess = nearest_candidate(path, all);
    if (!guess.empty()) return fmt::format("unknown key {}; did you mean {}?", path, guess);
    return fmt::format("unknown key {}", path);
  }
  const std::string guess = nearest_candidate(name, names);
  const std::string prefix = section.empty() ? "" : section + ".";
  if (!guess.empty()) return fmt::format("unknown key {}; did you mean {}{}?", path, prefix, guess);
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + names[i];
  return fmt::format("unknown key {}; {} has: {}", path, section.empty() ? "a recipe" : section, list);
}

void check_tree(const nlohmann::json& value, const KeySpec& spec, std::vector<std::string>& problems) {
  if (spec.kind != ValueKind::Section || !value.is_object()) {
    const std::string problem = check_value(spec, value);
    if (!problem.empty()) problems.push_back(fmt::format("{}: {}", spec.path, problem));
    return;
  }
  for (const auto& [name, member] : value.items()) {
    const std::string path = spec.path + "." + name;
    const KeySpec* member_spec = find_key(path);
    if (!member_spec) {
      problems.push_back(unknown_key_message(path));
      continue;
    }
    check_tree(member, *member_spec, problems);
  }
}

void check_document(const nlohmann::json& document, std::vector<std::string>& problems) {
  if (!document.is_object()) {
    problems.push_back(fmt::format("the recipe must be a JSON object with sections such as \"model\", found {}",
                                   document.is_array() ? "a list" : "a single value"));
    return;
  }
  for (const auto& [name, member] : document.items()) {
    const KeySpec* spec = find_key(name);
    if (!spec) {
      problems.push_back(unknown_key_message(name));
      continue;
    }
    check_tree(member, *spec, problems);
  }
}

void set_path(nlohmann::json& document, const std::string& path, const nlohmann::json& value) {
  nlohmann::json* node = &document;
  size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) *node = nlohmann::json::object();
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    node = &(*node)[part];
    start = dot + 1;
  }
}

const nlohmann::json* get_path(const nlohmann::json& document, const std::string& path) {
  const nlohmann::json* node = &document;
  size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    if (dot == std::string::npos) return &*it;
    node = &*it;
    start = dot + 1;
  }
}

}  // namespace trainer::recipe
