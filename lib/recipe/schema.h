#pragma once
// The recipe schema: every key a recipe may contain, its type, default, allowed range and a
// description, made from the keys() tables of recipe.h. It drives defaults, unknown-key and type
// errors, --set overrides and the key tables of docs/recipe.md (reference_doc.h).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace trainer::recipe {

// Bounds that keep size arithmetic exact in int64 (documented in docs/recipe.md).
constexpr int64_t kMaxParallelSize = 4096;       // tp, pp, vpp, cp, ep, etp
constexpr int64_t kMaxDataParallel = 1 << 20;    // dp
constexpr int64_t kMaxWorldSize = 1 << 24;       // --world-size
constexpr int64_t kMaxInteger = int64_t(1) << 40;  // every other integer key

enum class ValueKind { Integer, Number, Boolean, String, IntegerList, NumberList, StringList, Section };

struct KeySpec {
  std::string path;  // dotted JSON path: "parallel.tp"; sections too: "model.moe"
  ValueKind kind = ValueKind::Integer;
  nlohmann::json default_value;  // used when the key is absent; null means "derived" or "none"
  bool required = false;         // no default: the recipe (or model.hf_config) must give it
  bool nullable = false;         // null is an allowed value
  std::vector<std::string> choices;  // allowed strings (String, StringList); empty: any
  std::optional<double> min, max;    // inclusive bounds for numbers and list elements
  bool min_exclusive = false;
  std::optional<size_t> list_length;  // exact length for lists
  std::string doc;
  std::string doc_default;  // docs/recipe.md's default column where it is not the JSON default
};

// All keys, sections before their members, in documentation order.
const std::vector<KeySpec>& schema();

// The spec of a path ("parallel.tp"), or nullptr.
const KeySpec* find_key(const std::string& path);

// Paths of the direct members of a section ("" is the top level).
std::vector<std::string> member_paths(const std::string& section);

// A number as messages and docs write it: integral values without a fraction ("4096"), others
// with the shortest digits ("0.02").
std::string format_number(double value);

// Describes what a key accepts, for messages: "an integer >= 1", "one of gpipe, 1f1b, ...".
std::string describe_expected(const KeySpec& spec);

// Checks a value against a spec; returns "" when it conforms, else what is wrong
// ("found "x" (a string), expected an integer >= 1"). List elements are named by index.
std::string check_value(const KeySpec& spec, const nlohmann::json& value);

}  // namespace trainer::recipe
