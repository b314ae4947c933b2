// Model sizes no machine holds are refused before anything is allocated or looped over, in
// recipes and in the Hugging Face configs they read (named with the file); head_dim must be even.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>

#include "process.h"
#include "recipe/validate.h"
#include "recipe_fixture.h"

using namespace trainer::test;
using trainer::recipe::kMaxHiddenLayers;

TEST_CASE("sizes beyond the bounds are refused naming the key and the bound", "[recipe][rules]") {
  const auto problems = problems_of({"model.hidden_size=1099511627776", "model.num_hidden_layers=1000000"});
  CHECK(any_contains(problems, "model.hidden_size=1099511627776 exceeds the largest size trainer accepts, 131072"));
  CHECK(any_contains(problems, "model.num_hidden_layers=1000000 exceeds the largest size trainer accepts, 4096"));
  CHECK(any_contains(problems_of({"model.vocab_size=16777217"}), "model.vocab_size=16777217 exceeds"));
  CHECK(any_contains(problems_of({"model.max_position_embeddings=134217729"}), "model.max_position_embeddings"));
  CHECK_FALSE(any_contains(problems_of({"model.max_position_embeddings=134217728"}), "exceeds"));  // 13x a 10M context
  CHECK(any_contains(problems_of({"model.moe.num_local_experts=4097", "model.moe.num_experts_per_tok=1"}),
                     "model.moe.num_local_experts=4097 exceeds"));
  // At the bounds: accepted by this rule (others may still apply).
  CHECK_FALSE(any_contains(problems_of({fmt::format("model.num_hidden_layers={}", kMaxHiddenLayers)}), "exceeds"));
  CHECK(problems_of({"model.vocab_size=16777216"}).empty());
}

TEST_CASE("a model of more than 2^50 parameters is refused though each size is within its bound", "[recipe][rules]") {
  // 4096 layers of hidden 131072 with MLPs of 2^20: about 2^62 parameters.
  const auto problems = problems_of({"model.hidden_size=131072", "model.num_hidden_layers=4096",
                                     "model.intermediate_size=1048576", "model.num_attention_heads=1024",
                                     "model.num_key_value_heads=1024"});
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("parameters, more than the 1.13e+15 (2^50) trainer accepts") != std::string::npos);
  // Llama-3.1-405B-sized is far below it.
  CHECK(problems_of({"model.hidden_size=16384", "model.num_hidden_layers=126", "model.intermediate_size=53248",
                     "model.num_attention_heads=128", "model.num_key_value_heads=8", "model.vocab_size=128256"})
            .empty());
}

TEST_CASE("an odd head_dim is refused naming RoPE - given or derived", "[recipe][rules]") {
  CHECK(any_contains(problems_of({"model.head_dim=7"}),
                     "model.head_dim=7 is odd; rotary position embeddings (RoPE) rotate pairs of dimensions"));
  CHECK(any_contains(problems_of({"model.head_dim=1"}), "use 2"));
  // hidden 120 / 8 heads = 15.
  CHECK(any_contains(problems_of({"model.hidden_size=120"}), "model.head_dim=15 is odd"));
  CHECK(problems_of({"model.head_dim=8"}).empty());
}

TEST_CASE("a Hugging Face config with a billion layers is refused at once naming the file", "[recipe]") {
  TempDir dir;
  const std::string config = dir.write(
      "config.json", R"({"model_type": "mixtral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                          "num_hidden_layers": 1000000000, "num_attention_heads": 4, "num_local_experts": 4,
                          "num_experts_per_tok": 2, "head_dim": 7})");
  const auto start = std::chrono::steady_clock::now();
  const auto problems = problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + config + R"("}})");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));  // no list of 1e9 MoE layers
  CHECK(any_contains(problems, "model.hf_config " + config + ": model.num_hidden_layers=1000000000 exceeds"));
  CHECK(any_contains(problems, "model.hf_config " + config + ": model.head_dim=7 is odd"));
  const std::string typed = dir.write("typed.json", R"({"model_type": 5, "vocab_size": 256})");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + typed + R"("}})"),
                     "model.hf_config " + typed + ": model_type 5 is an integer; expected a string"));
}
