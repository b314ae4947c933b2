#include <catch2/catch.hpp>

#include "process.h"
#include "recipe_fixture.h"

using namespace trainer::test;

namespace {
const char* kLlamaConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072, "tie_word_embeddings": false, "attention_bias": false,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "torch_dtype": "bfloat16", "bos_token_id": 128000
})";

trainer::recipe::LoadedRecipe load_text(const std::string& text, const std::string& dir) {
  return trainer::recipe::load_recipe_text(text, dir + "/r.json", dir);
}
}  // namespace

TEST_CASE("model.hf_config reads a Hugging Face config - recipe fields override it", "[recipe]") {
  TempDir dir;
  dir.write("hf/config.json", kLlamaConfig);
  const auto r = load_text(R"({"model": {"hf_config": "hf", "num_hidden_layers": 2}})", dir.path()).recipe;
  CHECK(r.model.vocab_size == 128256);
  CHECK(r.model.num_key_value_heads == 8);
  CHECK(r.model.rope_theta == 500000.0);
  CHECK(r.model.num_hidden_layers == 2);  // the recipe wins
  CHECK(r.model.head_dim == 128);
  REQUIRE(r.model.rope_scaling);
  CHECK(r.model.rope_scaling->rope_type == "llama3");
  CHECK(r.model.rope_scaling->original_max_position_embeddings == 8192);
  // A file path works as well as its directory.
  CHECK(load_text(R"({"model": {"hf_config": "hf/config.json"}})", dir.path()).recipe.model.hidden_size == 4096);
}

TEST_CASE("a Mixtral config fills model.moe", "[recipe]") {
  TempDir dir;
  dir.write("config.json", R"({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "sliding_window": null,
    "rope_theta": 1000000.0})");
  const auto r = load_text(R"({"model": {"hf_config": "config.json"}})", dir.path()).recipe;
  REQUIRE(r.model.moe);
  CHECK(r.model.moe->num_local_experts == 8);
  CHECK(r.model.moe->router_aux_loss_coef == 0.02);
  CHECK(r.model.moe->moe_intermediate_size == 14336);
}

TEST_CASE("unsupported Hugging Face features are errors naming the file and field", "[recipe]") {
  TempDir dir;
  dir.write("config.json", R"({"model_type": "gpt2", "hidden_act": "gelu", "attention_bias": true,
    "sliding_window": 4096, "rope_scaling": {"rope_type": "yarn"}, "vocab_size": "x"})");
  const auto problems = problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"("}})");
  const std::string file = dir.path() + "/config.json";
  CHECK(any_contains(problems, "model.hf_config " + file + ": model_type \"gpt2\" is not supported"));
  CHECK(any_contains(problems, "hidden_act \"gelu\" is not supported"));
  CHECK(any_contains(problems, "attention_bias true is not supported"));
  CHECK(any_contains(problems, "sliding_window 4096 is not supported"));
  CHECK(any_contains(problems, "rope_scaling {\"rope_type\":\"yarn\"} is not supported"));
  CHECK(any_contains(problems, "model.vocab_size: found \"x\" (a string)"));
}

TEST_CASE("a missing or malformed hf_config file is a user error naming it", "[recipe]") {
  TempDir dir;
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": "/nonexistent/c.json"}})"),
                     "/nonexistent/c.json: cannot open file"));
  const std::string bad = dir.write("config.json", "{\"vocab_size\": }");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + bad + R"("}})"),
                     bad + ":1:16: malformed JSON"));
}
