#pragma once
// Reading JSON that a user wrote: errors carry the file, line and column; duplicate keys, which
// JSON parsers usually resolve silently, are errors too. Nesting is limited (kMaxJsonDepth), so a
// file nested a million levels deep is an error, not a stack overflow in code that walks the value.
#include <nlohmann/json.hpp>
#include <string>

namespace trainer {

// Arrays and objects nested deeper than this are refused; no file trainer reads needs more than
// a few levels.
inline constexpr int kMaxJsonDepth = 128;

// Throws UserError "SOURCE:LINE:COLUMN: JSON nested deeper than 128 levels" when arrays and objects
// in `text` (outside strings) nest deeper than kMaxJsonDepth. Malformed text is otherwise let
// through: use it before handing text to another parser.
void check_json_depth(const std::string& text, const std::string& source);

// Parses text (depth-limited, duplicate keys refused); `source` names it in errors (a file path,
// or "--set model.tp"). Throws UserError.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

// Reads and parses a JSON file. Throws UserError naming the file when it cannot be read or parsed,
// is not a regular file (a FIFO, a device, a directory) or is larger than kMaxTextFileBytes.
nlohmann::json read_json_file(const std::string& path);

// A compact, single-line rendering of a value for messages ("32", "\"bf16\"", "[0.9,0.95]").
std::string describe_json(const nlohmann::json& value);

// The JSON type of a value in words ("an integer", "a string", "null", ...).
std::string json_type_name(const nlohmann::json& value);

}  // namespace trainer
