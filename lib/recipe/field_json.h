#pragma once
// How each C++ type of a recipe member reads from and writes to JSON, and which schema kind it has
// (field.h). Internal to lib/recipe: the schema, the JSON round trip and the docs walk the keys()
// tables of recipe.h with these conversions. Values are read only after the schema has checked them,
// so a conversion that fails here is an internal error (std::logic_error).
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "recipe/choices.h"
#include "recipe/schema.h"

namespace trainer::recipe::field_json {

using nlohmann::json;

template <class T>
struct Conv;

template <>
struct Conv<int64_t> {
  static constexpr ValueKind kind = ValueKind::Integer;
  static json write(int64_t v) { return v; }
  // Integers may arrive as integral floats ("--set training.steps=1e3").
  static int64_t read(const json& j) {
    return j.is_number_integer() ? j.get<int64_t>() : static_cast<int64_t>(j.get<double>());
  }
};

template <>
struct Conv<double> {
  static constexpr ValueKind kind = ValueKind::Number;
  static json write(double v) { return v; }
  static double read(const json& j) { return j.get<double>(); }
};

template <>
struct Conv<bool> {
  static constexpr ValueKind kind = ValueKind::Boolean;
  static json write(bool v) { return v; }
  static bool read(const json& j) { return j.get<bool>(); }
};

template <>
struct Conv<std::string> {
  static constexpr ValueKind kind = ValueKind::String;
  static json write(const std::string& v) { return v; }
  static std::string read(const json& j) { return j.get<std::string>(); }
};

template <>
struct Conv<ResumeFrom> {
  static constexpr ValueKind kind = ValueKind::String;
  static json write(const ResumeFrom& v) { return v.text(); }
  static ResumeFrom read(const json& j) { return ResumeFrom::parse(j.get<std::string>()); }
};

template <class E>
  requires std::is_enum_v<E>
struct Conv<E> {
  static constexpr ValueKind kind = ValueKind::String;
  static std::vector<std::string> choices() { return enum_names<E>(); }
  static json write(E v) { return std::string(name_of(v)); }
  static E read(const json& j) {
    const std::string name = j.get<std::string>();
    if (auto v = enum_from_name<E>(name)) return *v;
    throw std::logic_error("recipe value \"" + name + "\" passed the schema but names no enum value");
  }
};

template <class T>
struct Conv<std::optional<T>> {
  static constexpr ValueKind kind = Conv<T>::kind;
  static constexpr bool nullable = true;
  static json write(const std::optional<T>& v) { return v ? Conv<T>::write(*v) : json(nullptr); }
  static std::optional<T> read(const json& j) {
    if (j.is_null()) return std::nullopt;
    return Conv<T>::read(j);
  }
};

constexpr ValueKind list_of(ValueKind element) {
  return element == ValueKind::Integer  ? ValueKind::IntegerList
         : element == ValueKind::Number ? ValueKind::NumberList
                                        : ValueKind::StringList;
}

template <class T>
struct Conv<std::vector<T>> {
  static constexpr ValueKind kind = list_of(Conv<T>::kind);
  static json write(const std::vector<T>& v) {
    json out = json::array();
    for (const auto& x : v) out.push_back(Conv<T>::write(x));
    return out;
  }
  static std::vector<T> read(const json& j) {
    std::vector<T> out;
    for (const auto& x : j) out.push_back(Conv<T>::read(x));
    return out;
  }
};

template <class T, size_t N>
struct Conv<std::array<T, N>> {
  static constexpr ValueKind kind = list_of(Conv<T>::kind);
  static constexpr size_t length = N;
  static json write(const std::array<T, N>& v) {
    json out = json::array();
    for (const auto& x : v) out.push_back(Conv<T>::write(x));
    return out;
  }
  static std::array<T, N> read(const json& j) {
    std::array<T, N> out{};
    for (size_t i = 0; i < N; ++i) out[i] = Conv<T>::read(j.at(i));
    return out;
  }
};

// Properties a Conv may leave out.
template <class T>
constexpr bool nullable() {
  if constexpr (requires { Conv<T>::nullable; }) return Conv<T>::nullable;
  return false;
}
template <class T>
std::optional<size_t> list_length() {
  if constexpr (requires { Conv<T>::length; }) return Conv<T>::length;
  return std::nullopt;
}
template <class T>
std::vector<std::string> choices() {
  if constexpr (requires { Conv<T>::choices(); }) return Conv<T>::choices();
  else if constexpr (requires { typename T::value_type; }) {
    if constexpr (!std::is_same_v<T, std::string>) return choices<typename T::value_type>();
  }
  return {};
}

template <class T>
struct Unwrap {
  using type = T;
  static constexpr bool optional = false;
};
template <class T>
struct Unwrap<std::optional<T>> {
  using type = T;
  static constexpr bool optional = true;
};

}  // namespace trainer::recipe::field_json
