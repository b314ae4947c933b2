#pragma once
// Reading JSON that a user wrote: errors carry the file, line and column; duplicate keys, which
// JSON parsers usually resolve silently, are errors too.
#include <nlohmann/json.hpp>
#include <string>

namespace trainer {

// Parses text; `source` names it in errors (a file path, or "--set model.tp"). Throws UserError.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

// Reads and parses a JSON file. Throws UserError naming the file when it cannot be read or parsed.
nlohmann::json read_json_file(const std::string& path);

// A compact, single-line rendering of a value for messages ("32", "\"bf16\"", "[0.9,0.95]").
std::string describe_json(const nlohmann::json& value);

// The JSON type of a value in words ("an integer", "a string", "null", ...).
std::string json_type_name(const nlohmann::json& value);

}  // namespace trainer
