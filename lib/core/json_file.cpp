#include "core/json_file.h"

#include <fmt/format.h>

#include <set>

#include "core/error.h"
#include "core/regular_file.h"

namespace trainer {

namespace {

// 1-based line and column of a byte offset.
std::pair<size_t, size_t> line_and_column(const std::string& text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

void check_json_depth(const std::string& text, const std::string& source) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        const auto [line, column] = line_and_column(text, i);
        throw UserError(fmt::format("{}:{}:{}: JSON nested deeper than {} levels (arrays and objects inside each "
                                    "other); no file trainer reads needs that many",
                                    source, line, column, kMaxJsonDepth));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  // Before the parser: nlohmann's values are copied, compared and printed recursively.
  check_json_depth(text, source);
  // Duplicate keys: the parser callback sees each key; one set of seen keys per open object.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based and points just past the offending character.
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    const auto [line, column] = line_and_column(text, offset);
    std::string reason = e.what();
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 1, column 2: why";
    // keep only the why.
    if (auto colon = reason.find(": "); colon != std::string::npos) reason = reason.substr(colon + 2);
    throw UserError(fmt::format("{}:{}:{}: malformed JSON: {}", source, line, column, reason));
  }
  if (!duplicate.empty())
    throw UserError(fmt::format("{}: duplicate key \"{}\" (JSON objects must not repeat a key)", source, duplicate));
  return value;
}

nlohmann::json read_json_file(const std::string& path) { return parse_json_text(read_text_file(path), path); }

std::string describe_json(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

std::string json_type_name(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "a list";
    case nlohmann::json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

}  // namespace trainer
