#pragma once
// What one recipe key says beyond its C++ type. Each section of recipe.h lists its keys once, in a
// static `keys(table)` function: JSON name, member, Rules, doc. From that one list lib/recipe makes
// the schema (types, defaults, ranges, choices: schema.h), the JSON round trip (recipe_json.h) and
// the key tables of docs/recipe.md (reference_doc.h). The JSON type follows from the member's type
// (int64_t: integer, double: number, an enum of choices.h: one of its names, std::optional: may be
// null, std::vector: a list, ...); the default is the member's initial value in the struct.
// Torch-free and JSON-free: recipe.h includes it.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::recipe {

struct Rules {
  std::optional<double> min, max;  // inclusive bounds for numbers and list elements
  bool min_exclusive = false;
  bool required = false;  // no default: the recipe (or model.hf_config) must give it
  // The default is null, read as the value of this other key ("model.num_attention_heads").
  std::string same_as;
  // The default is null, read by a rule of recipe_json.cpp (model.head_dim, model.moe.layers).
  bool computed = false;
  // A list whose default is null, read as an empty list (and an empty list written as null).
  bool empty_is_null = false;
  // Allowed strings of a string key (an enum's names come from choices.h); for an enum, the subset
  // and order to accept and list.
  std::vector<std::string> choices;
  // docs/recipe.md's default column when the JSON default would not read well ("all five").
  std::string doc_default;

  Rules at_least(double v) const { Rules r = *this; r.min = v; return r; }
  Rules at_most(double v) const { Rules r = *this; r.max = v; return r; }
  Rules must_give() const { Rules r = *this; r.required = true; return r; }
  Rules or_same_as(std::string key) const { Rules r = *this; r.same_as = std::move(key); return r; }
  Rules or_computed() const { Rules r = *this; r.computed = true; return r; }
  Rules null_is_empty() const { Rules r = *this; r.empty_is_null = true; return r; }
  Rules one_of(std::vector<std::string> c) const { Rules r = *this; r.choices = std::move(c); return r; }
  Rules shown_as(std::string text) const { Rules r = *this; r.doc_default = std::move(text); return r; }
};

inline Rules any() { return {}; }
inline Rules at_least(double v) { return Rules{}.at_least(v); }
inline Rules positive() { Rules r; r.min = 0; r.min_exclusive = true; return r; }
inline Rules between(double lo, double hi) { return Rules{}.at_least(lo).at_most(hi); }
inline Rules required() { return Rules{}.must_give(); }

}  // namespace trainer::recipe
