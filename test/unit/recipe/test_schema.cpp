#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "recipe/schema.h"

using namespace trainer::recipe;

TEST_CASE("schema paths are unique and sections precede their members", "[recipe]") {
  std::set<std::string> seen;
  for (const auto& spec : schema()) {
    INFO(spec.path);
    CHECK(seen.insert(spec.path).second);
    const auto dot = spec.path.rfind('.');
    if (dot != std::string::npos) {
      const KeySpec* parent = find_key(spec.path.substr(0, dot));
      REQUIRE(parent != nullptr);
      CHECK(parent->kind == ValueKind::Section);
      CHECK(seen.count(parent->path) == 1);
    }
    CHECK(!spec.doc.empty());
  }
}

TEST_CASE("every default conforms to its own spec", "[recipe]") {
  for (const auto& spec : schema()) {
    if (spec.required) continue;
    INFO(spec.path);
    CHECK(check_value(spec, spec.default_value).empty());
  }
}

TEST_CASE("type and range checks say what was found and what is expected", "[recipe]") {
  const KeySpec& tp = *find_key("parallel.tp");
  CHECK(check_value(tp, 2).empty());
  CHECK(check_value(tp, 2.0).empty());  // integral floats are integers
  CHECK(check_value(tp, 0) == "found 0, expected an integer >= 1 and <= 4096");
  CHECK(check_value(tp, 2.5) == "found 2.5, expected an integer >= 1 and <= 4096");
  CHECK(check_value(tp, "2") == "found \"2\" (a string), expected an integer >= 1 and <= 4096");
  CHECK(check_value(tp, nullptr) == "found null, expected an integer >= 1 and <= 4096");
  CHECK(check_value(*find_key("parallel.pipeline_schedule"), "zb") ==
        "found \"zb\", expected one of gpipe, 1f1b, interleaved_1f1b, zero_bubble, zbv");
  CHECK(check_value(*find_key("optimizer.betas"), nlohmann::json::array({0.9})) ==
        "found 1 element, expected a list of numbers >= 0 and <= 1 (2 elements)");
  CHECK(check_value(*find_key("optimizer.betas"), nlohmann::json::array({0.9, 1.5})) ==
        "element [1]: found 1.5, expected a list of numbers >= 0 and <= 1 (2 elements)");
  CHECK(check_value(*find_key("optimizer.lr"), 0) == "found 0, expected a number > 0");
  CHECK(check_value(*find_key("model.head_dim"), nullptr).empty());
  CHECK(check_value(*find_key("training.dtype"), true) == "found true (a boolean), expected one of bf16, fp32");
}

TEST_CASE("docs/recipe.md documents every key", "[recipe][docs]") {
  std::ifstream in(std::string(TRAINER_SOURCE_DIR) + "/docs/recipe.md");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& spec : schema()) {
    INFO(spec.path);
    CHECK(text.str().find("`" + spec.path + "`") != std::string::npos);
  }
}
