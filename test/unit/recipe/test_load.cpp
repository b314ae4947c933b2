#include <catch2/catch.hpp>

#include "recipe/keys.h"
#include "recipe/schema.h"
#include "process.h"
#include "recipe_fixture.h"

using namespace trainer::test;
using trainer::recipe::schema;
using trainer::recipe::ValueKind;
using namespace trainer::recipe;

TEST_CASE("defaults fill every key and derived fields are resolved", "[recipe]") {
  const auto loaded = load_base();
  const auto& r = loaded.recipe;
  CHECK(r.model.num_key_value_heads == 4);
  CHECK(r.model.head_dim == 32);  // hidden 256 / 8 heads
  CHECK(r.model.rope_theta == 10000.0);
  CHECK(!r.model.moe);
  CHECK(r.parallel.tp == 1);
  CHECK(r.parallel.etp == 1);  // derived from tp
  CHECK(r.parallel.dp == -1);  // no world size yet
  CHECK(r.parallel.pipeline_schedule == ScheduleKind::OneFOneB);
  CHECK(r.training.dtype == Precision::BF16);
  CHECK(r.optimizer.beta1() == 0.9);
  CHECK(r.optimizer.beta2() == 0.95);
  CHECK(r.checkpoint.resume.mode == ResumeFrom::Mode::Auto);
  CHECK(r.checkpoint.keep == 2);
  CHECK(r.hardware.gpu == "h100-sxm");
  // The resolved JSON has every key of the schema (null sections have no members).
  for (const auto& spec : schema()) {
    if (spec.path.rfind("model.moe.", 0) == 0 || spec.path.rfind("model.rope_scaling.", 0) == 0 ||
        spec.path.rfind("model.mla.", 0) == 0)
      continue;
    INFO(spec.path);
    CHECK(trainer::recipe::get_path(loaded.resolved, spec.path) != nullptr);
  }
}

TEST_CASE("num_key_value_heads and head_dim default from the heads", "[recipe]") {
  const auto r = load_base({"model.num_key_value_heads=null", "model.head_dim=null"}).recipe;
  CHECK(r.model.num_key_value_heads == 8);
  CHECK(r.model.head_dim == 32);
  CHECK(load_base({"model.head_dim=64"}).recipe.model.head_dim == 64);
}

TEST_CASE("a world size fills dp and the global batch", "[recipe]") {
  const auto loaded = load_base({}, 4);
  CHECK(loaded.recipe.parallel.dp == 4);
  REQUIRE(loaded.mesh);
  CHECK(loaded.mesh->grad_accum_steps == 4);  // 32 / (2 * 4)
  CHECK(loaded.resolved["parallel"]["dp"] == 4);
  const auto no_gbs = load_base({"training.global_batch_size=null"}, 4);
  CHECK(no_gbs.recipe.training.global_batch_size == 8);  // micro 2 x dp 4
  CHECK(no_gbs.mesh->grad_accum_steps == 1);
}

TEST_CASE("an explicit dp fixes the world size", "[recipe]") {
  const auto loaded = load_base({"parallel.dp=2", "parallel.tp=2"});
  REQUIRE(loaded.mesh);
  CHECK(loaded.mesh->world_size == 4);
}

TEST_CASE("missing required keys are reported together", "[recipe]") {
  const auto problems = problems_of({}, std::nullopt, R"({"model": {"vocab_size": 10}})");
  CHECK(problems.size() == 4);
  CHECK(any_contains(problems, "missing required key model.hidden_size (an integer >= 1"));
  CHECK(any_contains(problems, "missing required key model.num_attention_heads"));
}

TEST_CASE("unknown keys name the path and the nearest valid key", "[recipe]") {
  const auto problems = problems_of({}, std::nullopt, R"({
    "model": {"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 1, "num_key_value_head": 1},
    "parallel": {"tensor_parallel": 2},
    "training": {"lr": 0.1},
    "trainig": {}
  })");
  CHECK(any_contains(problems, "unknown key model.num_key_value_head; did you mean model.num_key_value_heads?"));
  CHECK(any_contains(problems, "unknown key parallel.tensor_parallel; parallel has: tp, pp,"));
  CHECK(any_contains(problems, "unknown key training.lr; did you mean optimizer.lr?"));
  CHECK(any_contains(problems, "unknown key trainig; did you mean training?"));
}

TEST_CASE("wrong types name the path - what was found and what is expected", "[recipe]") {
  const auto problems = problems_of({}, std::nullopt, R"({
    "model": {"vocab_size": "big", "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 1, "moe": 3},
    "training": {"dtype": "fp16"}
  })");
  CHECK(any_contains(problems, "model.vocab_size: found \"big\" (a string), expected an integer >= 1"));
  CHECK(any_contains(problems, "model.moe: found 3 (an integer), expected an object, or null"));
  CHECK(any_contains(problems, "training.dtype: found \"fp16\", expected one of bf16, fp32"));
}

TEST_CASE("the top level must be an object", "[recipe]") {
  CHECK(any_contains(problems_of({}, std::nullopt, "[1, 2]"), "must be a JSON object"));
  CHECK(any_contains(problems_of({}, std::nullopt, "42"), "must be a JSON object"));
}

TEST_CASE("a MoE section gets its defaults - and null layers mean all", "[recipe]") {
  const auto r = load_base({"model.moe={\"num_local_experts\": 8}"}).recipe;
  REQUIRE(r.model.moe);
  CHECK(r.model.moe->num_experts_per_tok == 2);
  CHECK(r.model.moe->moe_intermediate_size == 512);  // from intermediate_size
  CHECK(r.model.moe->layers.size() == 8);
  CHECK(r.model.is_moe_layer(7));
  const auto some = load_base({"model.moe.num_local_experts=8", "model.moe.layers=[1,3]"}).recipe;
  CHECK(some.model.moe->layers == std::vector<int64_t>{1, 3});
  CHECK(!some.model.is_moe_layer(0));
  CHECK(some.model.is_moe_layer(3));
  CHECK(any_contains(problems_of({"model.moe={}"}), "missing required key model.moe.num_local_experts"));
}

TEST_CASE("resolved JSON loads back to the same recipe", "[recipe]") {
  const auto first = load_base({"model.moe.num_local_experts=8", "model.moe.layers=[1,3]",
                                "model.rope_scaling={\"rope_type\":\"llama3\"}", "data.source=tokens",
                                "data.paths=[\"a\",\"b\"]", "data.weights=[1,2]"});
  const auto second = load_base({}, std::nullopt, first.resolved.dump());
  CHECK(first.resolved == second.resolved);
}

TEST_CASE("relative paths: in the recipe file against its directory - in --set against the working directory",
          "[recipe]") {
  trainer::test::TempDir dir;
  const std::string recipe = dir.write("sub/r.json", R"({"model": {"vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
    "init_from": "weights"}, "training": {"seq_len": 16, "micro_batch_size": 1, "global_batch_size": 1, "steps": 1},
    "checkpoint": {"dir": "../ck"}, "logging": {"metrics_file": "/abs/m.jsonl"},
    "data": {"source": "tokens", "paths": ["data/a", "/abs/b"]}})");
  trainer::recipe::LoadOptions options;
  const auto r = trainer::recipe::load_recipe(recipe, options).recipe;
  CHECK(*r.model.init_from == dir.path() + "/sub/weights");
  CHECK(*r.checkpoint.dir == dir.path() + "/ck");
  CHECK(*r.logging.metrics_file == "/abs/m.jsonl");
  CHECK(r.data.paths == std::vector<std::string>{dir.path() + "/sub/data/a", "/abs/b"});
  options.overrides = {"checkpoint.dir=here", "model.init_from=w2"};
  const auto set = trainer::recipe::load_recipe(recipe, options).recipe;
  CHECK(*set.checkpoint.dir == "here");
  CHECK(*set.model.init_from == "w2");
}

TEST_CASE("empty strings are not paths", "[recipe]") {
  for (const char* key : {"checkpoint.dir", "model.init_from", "logging.metrics_file", "model.hf_config"}) {
    INFO(key);
    CHECK(trainer::test::any_contains(trainer::test::problems_of({std::string(key) + "="}),
                                      std::string(key) + " is an empty string; give a path, or null for none"));
  }
}
