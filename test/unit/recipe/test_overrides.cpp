#include <catch2/catch.hpp>

#include "recipe_fixture.h"

using namespace trainer::test;
using namespace trainer::recipe;

TEST_CASE("overrides: --set overrides any leaf - with JSON or bare-word values", "[recipe]") {
  const auto r = load_base({"training.steps=20", "training.dtype=fp32", "optimizer.lr=1e-3",
                            "optimizer.betas=[0.8,0.9]", "parallel.sequence_parallel=true",
                            "checkpoint.dir=/tmp/ck", "checkpoint.dir=\"/tmp/ck2\"", "logging.metrics_file=m.jsonl"})
                     .recipe;
  CHECK(r.training.steps == 20);
  CHECK(r.training.dtype == Precision::FP32);
  CHECK(r.optimizer.lr == 1e-3);
  CHECK(r.optimizer.beta1() == 0.8);
  CHECK(r.parallel.sequence_parallel);
  CHECK(r.checkpoint.dir == "/tmp/ck2");  // the last override wins
  CHECK(r.logging.metrics_file == "m.jsonl");
}

TEST_CASE("overrides: --set can add and remove whole sections", "[recipe]") {
  CHECK(load_base({"model.moe.num_local_experts=4"}).recipe.model.moe->num_local_experts == 4);
  CHECK(!load_base({"model.moe.num_local_experts=4", "model.moe=null"}).recipe.model.moe);
}

TEST_CASE("overrides: --set integers accept integral floats like 1e3", "[recipe]") {
  CHECK(load_base({"training.steps=1e3"}).recipe.training.steps == 1000);
}

TEST_CASE("overrides: --set problems name the override - the path and the expected type", "[recipe]") {
  const auto problems = problems_of({"parallel.tpp=2", "training.steps=abc", "optimizer.lr=-1", "noequals", "=3",
                                     "model.moe.layers=[1,\"x\"]"});
  REQUIRE(problems.size() == 6);
  CHECK(problems[0] == "--set parallel.tpp=2: unknown key parallel.tpp; did you mean parallel.tp?");
  CHECK(problems[1] == "--set training.steps=abc: training.steps: found \"abc\" (a string), expected an integer >= 1 and <= 1099511627776");
  CHECK(problems[2] == "--set optimizer.lr=-1: optimizer.lr: found -1, expected a number > 0");
  CHECK(problems[3] == "--set noequals: expected KEY=VALUE, for example --set training.steps=20");
  CHECK(problems[4].rfind("--set =3: expected KEY=VALUE", 0) == 0);
  CHECK(any_contains(problems, "model.moe.layers: element [1]: found \"x\" (a string)"));
}

TEST_CASE("overrides: --set applies before cross-field rules", "[recipe]") {
  CHECK(any_contains(problems_of({"parallel.tp=3"}), "model.num_attention_heads=8 is not divisible by parallel.tp=3"));
  CHECK(problems_of({"parallel.tp=2"}).empty());
}
