#include "recipe/recipe_json.h"

#include <cmath>

#include <fmt/format.h>

#include <algorithm>

#include "recipe/field_json.h"
#include "recipe/keys.h"
#include "recipe/validate.h"

namespace trainer::recipe {

namespace {

using nlohmann::json;

const json& at(const json& doc, const std::string& path) {
  static const json null_value;
  const json* node = get_path(doc, path);
  return node ? *node : null_value;
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (!moe) return false;
  if (layer >= num_hidden_layers)
    return layer < num_hidden_layers + num_nextn_predict_layers && is_moe_layer(num_hidden_layers - 1);
  for (auto l : moe->layers)
    if (l == layer) return true;
  return false;
}

std::vector<int64_t> ModelConfig::routed_layers() const {
  if (!moe) return {};
  std::vector<int64_t> layers = moe->layers;
  for (int64_t k = 0; k < num_nextn_predict_layers; ++k)
    if (is_moe_layer(num_hidden_layers + k)) layers.push_back(num_hidden_layers + k);
  return layers;
}

int64_t ModelConfig::window_of(int64_t layer) const {
  if (!sliding_window) return 0;
  if (layer >= num_hidden_layers) return window_of(num_hidden_layers - 1);  // an MTP block: the last layer's kind
  for (auto l : sliding_window_layers)
    if (l == layer) return *sliding_window;
  return 0;
}

double ModelConfig::mla_softmax_factor() const {
  if (!mla || !rope_scaling) return 1.0;
  const double all_dim = rope_scaling->mscale_all_dim.value_or(0.0), factor = rope_scaling->factor;
  if (all_dim == 0 || factor <= 1) return 1.0;
  const double mscale = 0.1 * all_dim * std::log(factor) + 1.0;
  return mscale * mscale;
}

namespace {

// Reads the members of one section from the resolved document (every key present; field.h).
template <class S>
struct Reader {
  const json& doc;
  S& section_value;
  std::string prefix;

  template <class T>
  void key(const char* name, T S::*member, const Rules& rules, const char*) {
    const json& value = at(doc, prefix + name);
    if (value.is_null() && !rules.same_as.empty()) {
      section_value.*member = field_json::Conv<T>::read(at(doc, rules.same_as));
    } else if (value.is_null() && (rules.computed || rules.empty_is_null)) {
      section_value.*member = T{};  // computed: fill_computed() below
    } else {
      section_value.*member = field_json::Conv<T>::read(value);
    }
  }

  template <class T>
  void section(const char* name, T S::*member, const char*) {
    using Inner = typename field_json::Unwrap<T>::type;
    const std::string path = prefix + name;
    Inner* inner = nullptr;
    if constexpr (field_json::Unwrap<T>::optional) {
      if (at(doc, path).is_null()) {
        section_value.*member = std::nullopt;
        return;
      }
      inner = &(section_value.*member).emplace();
    } else {
      inner = &(section_value.*member);
    }
    Reader<Inner> members{doc, *inner, path + "."};
    Inner::keys(members);
  }
};

// Writes the members of one section.
template <class S>
struct Writer {
  json& out;
  const S& section_value;

  template <class T>
  void key(const char* name, T S::*member, const Rules& rules, const char*) {
    const T& value = section_value.*member;
    if constexpr (requires { value.empty(); }) {
      if (rules.empty_is_null && value.empty()) {
        out[name] = nullptr;
        return;
      }
    }
    out[name] = field_json::Conv<T>::write(value);
  }

  template <class T>
  void section(const char* name, T S::*member, const char*) {
    using Inner = typename field_json::Unwrap<T>::type;
    const Inner* inner = nullptr;
    if constexpr (field_json::Unwrap<T>::optional) {
      if (!(section_value.*member)) {
        out[name] = nullptr;
        return;
      }
      inner = &*(section_value.*member);
    } else {
      inner = &(section_value.*member);
    }
    json members = json::object();
    Writer<Inner> writer{members, *inner};
    Inner::keys(writer);
    out[name] = std::move(members);
  }
};

// The keys whose null is computed from several others (Rules::computed).
void fill_computed(const json& d, Recipe& r, std::vector<std::string>& problems) {
  auto& m = r.model;
  if (at(d, "model.head_dim").is_null()) {
    if (m.hidden_size % m.num_attention_heads != 0) {
      problems.push_back(fmt::format(
          "model.hidden_size={} is not divisible by model.num_attention_heads={}; set model.head_dim explicitly",
          m.hidden_size, m.num_attention_heads));
      m.head_dim = 1;
    } else {
      m.head_dim = m.hidden_size / m.num_attention_heads;
    }
  }
  if (m.moe && at(d, "model.moe.layers").is_null()) {
    // Bounded: validate_recipe refuses more layers than kMaxHiddenLayers, and a fuzzed 1e9
    // must not allocate 8 GB of layer numbers first.
    for (int64_t l = 0; l < std::min(m.num_hidden_layers, kMaxHiddenLayers + 1); ++l) m.moe->layers.push_back(l);
  }
  if (at(d, "model.sliding_window_layers").is_null())
    for (int64_t l = 0; l < std::min(m.num_hidden_layers, kMaxHiddenLayers + 1); ++l) m.sliding_window_layers.push_back(l);
}

}  // namespace

Recipe recipe_from_json(const json& d, std::vector<std::string>& problems) {
  Recipe r;
  Reader<Recipe> reader{d, r, ""};
  Recipe::keys(reader);
  fill_computed(d, r, problems);
  return r;
}

json recipe_to_json(const Recipe& r) {
  json out = json::object();
  Writer<Recipe> writer{out, r};
  Recipe::keys(writer);
  // model.moe.layers stays null when every layer is MoE (as the recipe said, or left it out).
  if (r.model.moe && static_cast<int64_t>(r.model.moe->layers.size()) == r.model.num_hidden_layers)
    out["model"]["moe"]["layers"] = nullptr;
  if (static_cast<int64_t>(r.model.sliding_window_layers.size()) == r.model.num_hidden_layers)
    out["model"]["sliding_window_layers"] = nullptr;
  return out;
}

}  // namespace trainer::recipe
