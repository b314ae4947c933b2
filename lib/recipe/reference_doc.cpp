#include "recipe/reference_doc.h"

#include <fmt/format.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "recipe/schema.h"

namespace trainer::recipe {

namespace {

constexpr const char* kBegin = "<!-- generated: keys of ";
constexpr const char* kBeginTail = " (lib/recipe/recipe.h; regenerate with scripts/update_recipe_docs) -->";
constexpr const char* kEnd = "<!-- end of generated keys -->";


// "integer >= 1", "integer 1..4096", "number > 0", "list of 2 numbers in 0..1"; every integer's
// bound of 2^40 is documented once under "Model sizes" and not repeated.
std::string range_text(const KeySpec& s, bool list) {
  const bool generic_max = s.max && *s.max == double(kMaxInteger);
  const std::optional<double> max = generic_max ? std::nullopt : s.max;
  if (s.min && max) return fmt::format("{}{}..{}", list ? " in " : " ", format_number(*s.min), format_number(*max));
  if (s.min) return fmt::format(" {} {}", s.min_exclusive ? ">" : ">=", format_number(*s.min));
  if (max) return fmt::format(" <= {}", format_number(*max));
  return "";
}

std::string choices_text(const std::vector<std::string>& choices) {
  std::string text;
  for (size_t i = 0; i < choices.size(); ++i)
    text += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + fmt::format("`{}`", choices[i]);
  return text;
}

std::string type_text(const KeySpec& s) {
  std::string text;
  switch (s.kind) {
    case ValueKind::Section: text = "section"; break;
    case ValueKind::Integer: text = "integer" + range_text(s, false); break;
    case ValueKind::Number: text = "number" + range_text(s, false); break;
    case ValueKind::Boolean: text = "boolean"; break;
    case ValueKind::String: text = s.choices.empty() ? "string" : choices_text(s.choices); break;
    case ValueKind::IntegerList:
    case ValueKind::NumberList: {
      const char* element = s.kind == ValueKind::IntegerList ? "integers" : "numbers";
      text = s.list_length ? fmt::format("list of {} {}", *s.list_length, element) : fmt::format("list of {}", element);
      text += range_text(s, true);
      break;
    }
    case ValueKind::StringList:
      text = s.choices.empty() ? "list of strings" : "list of: " + choices_text(s.choices);
      break;
  }
  if (s.nullable) text += (s.kind == ValueKind::IntegerList || s.kind == ValueKind::NumberList ? ", or null" : " or null");
  return text;
}

// JSON as a reader writes it: 1e-6 rather than 1e-06, [0.9, 0.95] with a space.
std::string json_text(const nlohmann::json& v) {
  if (v.is_number_float()) {
    std::string text = fmt::format("{}", v.get<double>());
    const auto e = text.find("e-0");
    if (e != std::string::npos) text.erase(e + 2, 1);
    return text;
  }
  if (v.is_array()) {
    std::string text = "[";
    for (size_t i = 0; i < v.size(); ++i) text += (i ? ", " : "") + json_text(v[i]);
    return text + "]";
  }
  return v.dump();
}

std::string default_text(const KeySpec& s) {
  if (s.required) return "required";
  if (!s.doc_default.empty()) return s.doc_default;
  return fmt::format("`{}`", json_text(s.default_value));
}

std::string row(const KeySpec& s) {
  return fmt::format("| `{}` | {} | {} | {} |\n", s.path, type_text(s), default_text(s), s.doc);
}

}  // namespace

std::string key_table(const std::string& section) {
  const KeySpec* own = find_key(section);
  if (!own || own->kind != ValueKind::Section) throw std::invalid_argument("no recipe section " + section);
  std::string table = "| key | type | default | meaning |\n|-----|------|---------|---------|\n" + row(*own);
  for (const auto& path : member_paths(section)) table += row(*find_key(path));
  return table;
}

std::string update_reference_doc(const std::string& document) {
  std::istringstream in(document);
  std::string out, line;
  while (std::getline(in, line)) {
    if (line.rfind(kBegin, 0) != 0) {
      out += line + "\n";
      continue;
    }
    const std::string rest = line.substr(std::string(kBegin).size());
    const std::string section = rest.substr(0, rest.find(' '));
    bool ended = false;
    while (std::getline(in, line))
      if (line == kEnd) {
        ended = true;
        break;
      }
    if (!ended) throw std::invalid_argument("the generated keys of " + section + " have no end marker " + kEnd);
    out += kBegin + section + kBeginTail + "\n" + key_table(section) + kEnd + "\n";
  }
  return out;
}

std::vector<std::string> sections_without_table(const std::string& document) {
  std::vector<std::string> missing;
  for (const auto& spec : schema())
    if (spec.kind == ValueKind::Section && document.find(kBegin + spec.path + " ") == std::string::npos)
      missing.push_back(spec.path);
  return missing;
}

}  // namespace trainer::recipe
