#pragma once
// Walking recipe JSON against the schema: unknown keys with "did you mean", type checks of whole
// subtrees, and setting a value at a dotted path.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/schema.h"

namespace trainer::recipe {

// "unknown key parallel.tpp; did you mean parallel.tp?" (or a list of the valid keys there).
std::string unknown_key_message(const std::string& path);

// Checks `value` found at spec.path, recursing into sections; appends "path: problem" lines.
void check_tree(const nlohmann::json& value, const KeySpec& spec, std::vector<std::string>& problems);

// Checks a whole recipe document (an object of sections).
void check_document(const nlohmann::json& document, std::vector<std::string>& problems);

// Sets document[a][b][c] = value for path "a.b.c", replacing non-objects on the way.
void set_path(nlohmann::json& document, const std::string& path, const nlohmann::json& value);

// document at path, or nullptr when absent.
const nlohmann::json* get_path(const nlohmann::json& document, const std::string& path);

}  // namespace trainer::recipe
