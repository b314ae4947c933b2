#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "recipe/recipe.h"
#include "recipe/recipe_json.h"
#include "recipe/reference_doc.h"
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

// docs/recipe.md's key tables are made from recipe.h's keys() tables. TRAINER_UPDATE_DOCS=1 (what
// scripts/update_recipe_docs sets) rewrites the document instead of failing.
TEST_CASE("docs/recipe.md's key tables are recipe.h's field tables", "[recipe][docs]") {
  const std::string path = std::string(TRAINER_SOURCE_DIR) + "/docs/recipe.md";
  std::string text;
  {
    std::ifstream in(path);
    REQUIRE(in.good());
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  CHECK(sections_without_table(text).empty());
  const std::string updated = update_reference_doc(text);
  const char* update = std::getenv("TRAINER_UPDATE_DOCS");
  if (update && std::string(update) == "1" && updated != text) {
    std::ofstream(path) << updated;
    WARN("rewrote " << path);
    return;
  }
  INFO("docs/recipe.md's key tables differ from lib/recipe/recipe.h: run scripts/update_recipe_docs");
  CHECK(updated == text);
}

TEST_CASE("a key's table row says its type - default and doc", "[recipe][docs]") {
  const std::string table = key_table("optimizer");
  CHECK(table.find("| `optimizer` | section | `{}` |") != std::string::npos);
  CHECK(table.find("| `optimizer.decay` | `cosine`, `linear` or `constant` | `\"cosine\"` |") != std::string::npos);
  CHECK(table.find("| `optimizer.betas` | list of 2 numbers in 0..1 | `[0.9, 0.95]` |") != std::string::npos);
  const std::string model = key_table("model");
  CHECK(model.find("| `model.vocab_size` | integer >= 1 | required |") != std::string::npos);
  CHECK(model.find("| `model.moe` | section or null | `null` |") != std::string::npos);
  CHECK(model.find("model.moe.num_local_experts") == std::string::npos);  // in model.moe's own table
  CHECK(key_table("parallel").find("| `parallel.tp` | integer 1..4096 | `1` |") != std::string::npos);
}

// The JSON round trip is made from the same tables: every key of the schema is written, defaults
// read back as the struct's initial values, and enum-like keys as their enums.
TEST_CASE("recipe_to_json writes every schema key and reads back the same recipe", "[recipe]") {
  Recipe r;
  r.model.vocab_size = 100;
  r.model.hidden_size = 64;
  r.model.intermediate_size = 96;
  r.model.num_hidden_layers = 3;
  r.model.num_attention_heads = 4;
  r.model.num_key_value_heads = 2;
  r.model.head_dim = 16;
  r.model.moe.emplace();
  r.model.moe->num_local_experts = 4;
  r.model.moe->moe_intermediate_size = 32;
  r.model.moe->layers = {0, 2};
  r.model.moe->scoring_func = ScoringFunc::Sigmoid;
  r.model.mla.emplace();
  r.model.mla->q_lora_rank = 24;
  r.model.num_nextn_predict_layers = 1;
  r.parallel.pipeline_schedule = ScheduleKind::ZBV;
  r.training.fused_kernels = {FusedKernel::Swiglu, FusedKernel::RmsNorm};
  r.checkpoint.resume = ResumeFrom::parse("/ckpt/step-00000010");
  const nlohmann::json j = recipe_to_json(r);
  for (const auto& spec : schema()) {
    if (spec.path.rfind("model.rope_scaling.", 0) == 0) continue;  // a null section has no members
    INFO(spec.path);
    nlohmann::json::json_pointer pointer("/" + [&] {
      std::string p = spec.path;
      for (auto& c : p)
        if (c == '.') c = '/';
      return p;
    }());
    CHECK(j.contains(pointer));
  }
  CHECK(j["parallel"]["pipeline_schedule"] == "zbv");
  CHECK(j["model"]["moe"]["scoring_func"] == "sigmoid");
  CHECK(j["model"]["moe"]["layers"] == nlohmann::json::array({0, 2}));
  CHECK(j["model"]["mla"]["q_lora_rank"] == 24);
  CHECK(j["model"]["mla"]["kv_lora_rank"] == 512);
  CHECK(j["model"]["num_nextn_predict_layers"] == 1);
  CHECK(j["model"]["rope_scaling"].is_null());
  CHECK(j["training"]["fused_kernels"] == nlohmann::json::array({"swiglu", "rms_norm"}));
  CHECK(j["checkpoint"]["resume"] == "/ckpt/step-00000010");
  CHECK(j["optimizer"]["betas"] == nlohmann::json::array({0.9, 0.95}));
  CHECK(j["data"]["weights"].is_null());  // empty is null
  std::vector<std::string> problems;
  const Recipe back = recipe_from_json(j, problems);
  CHECK(problems.empty());
  CHECK(recipe_to_json(back) == j);
  CHECK(back.parallel.pipeline_schedule == ScheduleKind::ZBV);
  CHECK(back.checkpoint.resume.mode == ResumeFrom::Mode::Path);
  CHECK(back.checkpoint.resume.path == "/ckpt/step-00000010");
  CHECK(back.training.fused_kernels == std::vector<FusedKernel>{FusedKernel::Swiglu, FusedKernel::RmsNorm});
}
