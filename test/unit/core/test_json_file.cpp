#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "core/json_file.h"

using trainer::parse_json_text;
using trainer::UserError;

namespace {
std::string error_of(const std::string& text) {
  try {
    parse_json_text(text, "r.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("malformed JSON names the file - line and column", "[core]") {
  CHECK(error_of("{\n  \"a\": 1,\n  \"b\" 2\n}") .rfind("r.json:3:7: malformed JSON", 0) == 0);
  CHECK(error_of("{\"a\": 1,}").rfind("r.json:1:9: malformed JSON", 0) == 0);
  CHECK(error_of("").rfind("r.json:1:1: malformed JSON", 0) == 0);
  CHECK(error_of("{\"a\": [1, 2}").find("r.json:1:") == 0);
}

TEST_CASE("duplicate keys are errors - at any depth", "[core]") {
  CHECK(error_of("{\"a\": 1, \"a\": 2}") == "r.json: duplicate key \"a\" (JSON objects must not repeat a key)");
  CHECK(error_of("{\"m\": {\"x\": 1, \"x\": 1}}").find("duplicate key \"x\"") != std::string::npos);
  // The same key in sibling objects is fine.
  CHECK(error_of("{\"m\": {\"x\": 1}, \"n\": {\"x\": 1}}").empty());
}

TEST_CASE("a missing file is a user error naming it", "[core]") {
  CHECK_THROWS_WITH(trainer::read_json_file("/nonexistent/recipe.json"),
                    Catch::Matchers::StartsWith("/nonexistent/recipe.json: cannot open file ("));
}

TEST_CASE("nesting deeper than the limit is an error naming the place - not a stack overflow", "[core]") {
  const int limit = trainer::kMaxJsonDepth;
  const std::string at_limit = std::string(size_t(limit), '[') + std::string(size_t(limit), ']');
  CHECK(error_of(at_limit).empty());
  const std::string over = std::string(size_t(limit) + 1, '[') + std::string(size_t(limit) + 1, ']');
  CHECK(error_of(over) == fmt::format("r.json:1:{}: JSON nested deeper than {} levels (arrays and objects inside each "
                                      "other); no file trainer reads needs that many",
                                      limit + 1, limit));
  // A million levels, unterminated as a fuzzer writes them, and inside objects.
  CHECK(error_of(std::string(1000000, '[')).find("r.json:1:129: JSON nested deeper") == 0);
  std::string objects;
  for (int i = 0; i < 200000; ++i) objects += "{\"a\":";
  CHECK(error_of("\n" + objects).find("r.json:2:") == 0);
  // Brackets inside strings are text, also after an escaped quote.
  const std::string in_string = "{\"a\": \"\\\"" + std::string(1000, '[') + "\"}";
  CHECK(error_of(in_string).empty());
  CHECK_THROWS_WITH(trainer::check_json_depth(over, "--set model.x"),
                    Catch::Matchers::StartsWith("--set model.x:1:129: JSON nested deeper"));
}

TEST_CASE("json values are described for messages", "[core]") {
  CHECK(trainer::describe_json(nlohmann::json(32)) == "32");
  CHECK(trainer::describe_json(nlohmann::json("bf16")) == "\"bf16\"");
  CHECK(trainer::json_type_name(nlohmann::json(2.5)) == "a number");
  CHECK(trainer::json_type_name(nlohmann::json::array()) == "a list");
  CHECK(trainer::describe_json(nlohmann::json(std::string(200, 'x'))).size() == 80);
}
