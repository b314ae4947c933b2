#include "recipe/schema.h"
#include "core/plural.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/json_file.h"
#include "recipe/field_json.h"
#include "recipe/recipe.h"

namespace trainer::recipe {

namespace {

using nlohmann::json;
using K = ValueKind;

// Walks the keys() tables of recipe.h (field.h), one KeySpec per key and section, sections before
// their members. `defaults` is a default-constructed section: its members' initial values are the
// defaults.
template <class S>
struct SchemaTable {
  std::vector<KeySpec>& out;
  std::string prefix;
  const S& defaults;

  template <class T>
  void key(const char* name, T S::*member, const Rules& rules, const char* doc) {
    using Conv = field_json::Conv<T>;
    KeySpec s;
    s.path = prefix + name;
    s.kind = Conv::kind;
    s.doc = doc;
    s.doc_default = rules.doc_default;
    s.default_value = Conv::write(defaults.*member);
    if (field_json::nullable<T>() || !rules.same_as.empty() || rules.computed || rules.empty_is_null) {
      s.nullable = true;
      s.default_value = nullptr;
    }
    if (rules.required) {
      s.required = true;
      s.nullable = false;
      s.default_value = nullptr;
    }
    s.min = rules.min;
    s.max = rules.max;
    s.min_exclusive = rules.min_exclusive;
    s.choices = rules.choices.empty() ? field_json::choices<T>() : rules.choices;
    s.list_length = field_json::list_length<T>();
    out.push_back(std::move(s));
  }

  template <class T>
  void section(const char* name, T S::*, const char* doc) {
    using Inner = typename field_json::Unwrap<T>::type;
    KeySpec s;
    s.path = prefix + name;
    s.kind = K::Section;
    s.nullable = field_json::Unwrap<T>::optional;
    s.default_value = s.nullable ? json(nullptr) : json::object();
    s.doc = doc;
    const std::string path = s.path;
    out.push_back(std::move(s));
    const Inner inner_defaults{};
    SchemaTable<Inner> members{out, path + ".", inner_defaults};
    Inner::keys(members);
  }
};

std::vector<KeySpec> build_schema() {
  std::vector<KeySpec> s;
  const Recipe defaults{};
  SchemaTable<Recipe> table{s, "", defaults};
  Recipe::keys(table);

  // Upper bounds keep every product of sizes (tp*cp*dp*pp, micro_batch*dp, ...) far from int64
  // overflow: parallel sizes up to 4096 (dp up to 2^20), other integers up to 2^40.
  for (auto& spec : s) {
    if (spec.kind != K::Integer && spec.kind != K::IntegerList) continue;
    if (spec.max) continue;
    if (spec.path == "parallel.dp")
      spec.max = double(kMaxDataParallel);
    else if (spec.path.rfind("parallel.", 0) == 0 || spec.path == "hardware.gpus_per_node")
      spec.max = double(kMaxParallelSize);
    else
      spec.max = double(kMaxInteger);
  }
  return s;
}


std::string bounds_text(const KeySpec& spec) {
  std::string text;
  if (spec.min) text += fmt::format(" {} {}", spec.min_exclusive ? ">" : ">=", format_number(*spec.min));
  if (spec.max) text += fmt::format("{} <= {}", spec.min ? " and" : "", format_number(*spec.max));
  return text;
}

std::string element_problem(const KeySpec& spec, const json& value, bool integer, const std::string& what) {
  if (!value.is_number()) return fmt::format("found {} ({}), expected {}", describe_json(value), json_type_name(value), what);
  if (integer && !value.is_number_integer() && value.get<double>() != std::floor(value.get<double>()))
    return fmt::format("found {}, expected {}", describe_json(value), what);
  const double v = value.get<double>();
  if (!std::isfinite(v)) return fmt::format("found {}, expected a finite number", describe_json(value));
  if (spec.min && (v < *spec.min || (spec.min_exclusive && v == *spec.min)))
    return fmt::format("found {}, expected {}", describe_json(value), what);
  if (spec.max && v > *spec.max) return fmt::format("found {}, expected {}", describe_json(value), what);
  if (integer && std::fabs(v) > 9.0e15) return fmt::format("found {}, which is too large", describe_json(value));
  return "";
}

std::string choice_problem(const KeySpec& spec, const json& value, const std::string& what) {
  if (!value.is_string()) return fmt::format("found {} ({}), expected {}", describe_json(value), json_type_name(value), what);
  if (spec.choices.empty()) return "";
  for (const auto& c : spec.choices)
    if (c == value.get<std::string>()) return "";
  return fmt::format("found {}, expected {}", describe_json(value), what);
}

}  // namespace

std::string format_number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<long long>(v));
  return fmt::format("{}", v);
}

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = build_schema();
  return table;
}

const KeySpec* find_key(const std::string& path) {
  for (const auto& spec : schema())
    if (spec.path == path) return &spec;
  return nullptr;
}

std::vector<std::string> member_paths(const std::string& section) {
  std::vector<std::string> members;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& spec : schema()) {
    if (spec.path.rfind(prefix, 0) != 0) continue;
    if (spec.path.find('.', prefix.size()) != std::string::npos) continue;
    members.push_back(spec.path);
  }
  return members;
}

std::string describe_expected(const KeySpec& spec) {
  std::string text;
  auto choices = [&] {
    std::string list;
    for (size_t i = 0; i < spec.choices.size(); ++i) list += (i ? ", " : "") + spec.choices[i];
    return list;
  };
  switch (spec.kind) {
    case K::Integer: text = "an integer" + bounds_text(spec); break;
    case K::Number: text = "a number" + bounds_text(spec); break;
    case K::Boolean: text = "true or false"; break;
    case K::String: text = spec.choices.empty() ? "a string" : "one of " + choices(); break;
    case K::IntegerList: text = "a list of integers" + bounds_text(spec); break;
    case K::NumberList: text = "a list of numbers" + bounds_text(spec); break;
    case K::StringList: text = spec.choices.empty() ? "a list of strings" : "a list of: " + choices(); break;
    case K::Section: text = "an object"; break;
  }
  if (spec.list_length) text = fmt::format("{} ({} elements)", text, *spec.list_length);
  if (spec.nullable) text += ", or null";
  return text;
}

std::string check_value(const KeySpec& spec, const json& value) {
  const std::string what = describe_expected(spec);
  if (value.is_null()) return spec.nullable ? "" : fmt::format("found null, expected {}", what);
  auto type_problem = [&] {
    return fmt::format("found {} ({}), expected {}", describe_json(value), json_type_name(value), what);
  };
  switch (spec.kind) {
    case K::Integer: return element_problem(spec, value, true, what);
    case K::Number: return element_problem(spec, value, false, what);
    case K::Boolean: return value.is_boolean() ? "" : type_problem();
    case K::String: return choice_problem(spec, value, what);
    case K::Section: return value.is_object() ? "" : type_problem();
    case K::IntegerList:
    case K::NumberList:
    case K::StringList: {
      if (!value.is_array()) return type_problem();
      if (spec.list_length && value.size() != *spec.list_length)
        return fmt::format("found {}, expected {}", count_of(int64_t(value.size()), "element", "elements"), what);
      for (size_t i = 0; i < value.size(); ++i) {
        std::string problem = spec.kind == K::StringList
                                  ? choice_problem(spec, value[i], what)
                                  : element_problem(spec, value[i], spec.kind == K::IntegerList, what);
        if (!problem.empty()) return fmt::format("element [{}]: {}", i, problem);
      }
      return "";
    }
  }
  return type_problem();
}

}  // namespace trainer::recipe
