#include <catch2/catch.hpp>

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
  CHECK_THROWS_WITH(trainer::read_json_file("/nonexistent/recipe.json"), "/nonexistent/recipe.json: cannot open file");
}

TEST_CASE("json values are described for messages", "[core]") {
  CHECK(trainer::describe_json(nlohmann::json(32)) == "32");
  CHECK(trainer::describe_json(nlohmann::json("bf16")) == "\"bf16\"");
  CHECK(trainer::json_type_name(nlohmann::json(2.5)) == "a number");
  CHECK(trainer::json_type_name(nlohmann::json::array()) == "a list");
  CHECK(trainer::describe_json(nlohmann::json(std::string(200, 'x'))).size() == 80);
}
