#include <catch2/catch.hpp>

#include <stdexcept>

#include "estimate/model_counts.h"
#include "recipe/load.h"

using trainer::estimate::count_model;
using trainer::recipe::ModelConfig;
using trainer::recipe::MoeConfig;

namespace {

ModelConfig llama3_8b() {
  ModelConfig m;
  m.vocab_size = 128256;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_hidden_layers = 32;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  m.head_dim = 128;
  return m;
}

ModelConfig mixtral_8x7b() {
  ModelConfig m = llama3_8b();
  m.vocab_size = 32000;
  MoeConfig moe;
  moe.num_local_experts = 8;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 14336;
  for (int64_t l = 0; l < 32; ++l) moe.layers.push_back(l);
  m.moe = moe;
  return m;
}

// V=10, H=4, I=6, 2 layers, 2 heads of dim 2, 1 key/value head.
ModelConfig tiny() {
  ModelConfig m;
  m.vocab_size = 10;
  m.hidden_size = 4;
  m.intermediate_size = 6;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 2;
  return m;
}

}  // namespace

TEST_CASE("a tiny dense model counted by hand", "[estimate]") {
  const auto c = count_model(tiny(), 8);
  CHECK(c.embedding_params == 40);             // 10 * 4
  CHECK(c.lm_head_params == 40);
  CHECK(c.attention_params_per_layer == 48);   // q 4*2*2=16, k 4*1*2=8, v 8, o 16
  CHECK(c.norm_params_per_layer == 8);         // 2 * 4
  CHECK(c.dense_mlp_params_per_layer == 72);   // 3 * 4 * 6
  CHECK(c.moe_params_per_layer == 0);
  CHECK(c.final_norm_params == 4);
  REQUIRE(c.layers.size() == 2);
  CHECK(c.layers[1].index == 1);
  CHECK_FALSE(c.layers[1].moe);
  CHECK(c.layers[1].params == 128);            // 48 + 8 + 72
  CHECK(c.num_dense_layers == 2);
  CHECK(c.num_moe_layers == 0);
  CHECK(c.total_params == 340);                // 40 + 40 + 4 + 2 * 128
  CHECK(c.active_params == 340);
  CHECK(c.matmul_params_per_token == 300);     // everything but the embedding
  CHECK(c.dense_flops_per_token == 1800.0);    // 6 * 300
  CHECK(c.attention_flops_per_token == 768.0); // 12 * 2 layers * 2 heads * 2 dim * 8 tokens
  CHECK(c.flops_per_token == 2568.0);
  CHECK(c.seq_len == 8);
}

TEST_CASE("tying the LM head removes its parameters but not its FLOPs", "[estimate]") {
  auto m = tiny();
  m.tie_word_embeddings = true;
  const auto tied = count_model(m, 8);
  const auto untied = count_model(tiny(), 8);
  CHECK(tied.lm_head_params == 0);
  CHECK(tied.total_params == 300);
  CHECK(untied.total_params - tied.total_params == 40);
  CHECK(tied.matmul_params_per_token == 300);  // the tied head still runs its [V,H] product
  CHECK(tied.flops_per_token == untied.flops_per_token);
}

TEST_CASE("derived fields default like the recipe loader", "[estimate]") {
  auto m = tiny();
  m.num_key_value_heads = 0;  // -> 2 heads
  m.head_dim = 0;             // -> 4 / 2
  const auto c = count_model(m, 8);
  CHECK(c.attention_params_per_layer == 64);  // 4 projections of 4*4
}

TEST_CASE("a tiny MoE model with a shared expert and one dense layer counted by hand", "[estimate]") {
  auto m = tiny();
  MoeConfig moe;
  moe.num_local_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 3;
  moe.num_shared_experts = 1;
  moe.layers = {1};
  m.moe = moe;
  const auto c = count_model(m, 8);
  CHECK(c.expert_params == 36);                   // 3 * 4 * 3
  CHECK(c.router_params_per_layer == 16);         // 4 experts * 4
  CHECK(c.shared_expert_params_per_layer == 36);
  CHECK(c.moe_params_per_layer == 196);           // 16 + 4 * 36 + 36
  CHECK(c.moe_active_params_per_layer == 124);    // 16 + 2 * 36 + 36
  REQUIRE(c.layers.size() == 2);
  CHECK_FALSE(c.layers[0].moe);
  CHECK(c.layers[0].params == 128);
  CHECK(c.layers[1].moe);
  CHECK(c.layers[1].params == 252);               // 48 + 8 + 196
  CHECK(c.layers[1].active_params == 180);        // 48 + 8 + 124
  CHECK(c.num_dense_layers == 1);
  CHECK(c.num_moe_layers == 1);
  CHECK(c.total_params == 464);                   // 84 + 128 + 252
  CHECK(c.active_params == 392);                  // 84 + 128 + 180
  CHECK(c.active_params < c.total_params);
  CHECK(c.flops_per_token == 2880.0);             // 6 * (392 - 40) + 768
}

TEST_CASE("Llama-3-8B has 8030261248 parameters", "[estimate]") {
  const auto c = count_model(llama3_8b(), 8192);
  CHECK(c.embedding_params == 525'336'576);
  CHECK(c.lm_head_params == 525'336'576);
  CHECK(c.attention_params_per_layer == 41'943'040);
  CHECK(c.dense_mlp_params_per_layer == 176'160'768);
  CHECK(c.total_params == 8'030'261'248);
  CHECK(c.active_params == c.total_params);
  // 6 * (8,030,261,248 - 525,336,576) + 12 * 32 * 32 * 128 * 8192
  CHECK(c.dense_flops_per_token == 45'029'548'032.0);
  CHECK(c.attention_flops_per_token == 12'884'901'888.0);
  CHECK(c.flops_per_token == 57'914'449'920.0);
}

TEST_CASE("Mixtral-8x7B has 46702792704 parameters and 12879925248 active", "[estimate]") {
  const auto c = count_model(mixtral_8x7b(), 4096);
  CHECK(c.num_moe_layers == 32);
  CHECK(c.num_dense_layers == 0);
  CHECK(c.moe_params_per_layer == 1'409'318'912);        // 8 * 176,160,768 + 32,768
  CHECK(c.moe_active_params_per_layer == 352'354'304);   // 2 * 176,160,768 + 32,768
  CHECK(c.total_params == 46'702'792'704);
  CHECK(c.active_params == 12'879'925'248);
  // 6 * (12,879,925,248 - 131,072,000) + 12 * 32 * 32 * 128 * 4096
  CHECK(c.flops_per_token == 76'493'119'488.0 + 6'442'450'944.0);
}

TEST_CASE("a loaded recipe counts like the hand-built config", "[estimate]") {
  const auto llama = trainer::recipe::load_recipe(TRAINER_SOURCE_DIR "/recipes/llama3-8b.json");
  CHECK(count_model(llama.recipe.model, 8192).total_params == 8'030'261'248);
  // model.moe.layers is null there: every layer is an MoE layer.
  const auto mixtral = trainer::recipe::load_recipe(TRAINER_SOURCE_DIR "/recipes/mixtral-8x7b.json");
  const auto c = count_model(mixtral.recipe.model, 4096);
  CHECK(c.num_moe_layers == 32);
  CHECK(c.total_params == 46'702'792'704);
}

TEST_CASE("impossible sizes are rejected", "[estimate]") {
  auto m = tiny();
  m.hidden_size = 0;
  CHECK_THROWS_AS(count_model(m, 8), std::invalid_argument);
  CHECK_THROWS_AS(count_model(tiny(), 0), std::invalid_argument);
  auto moe = tiny();
  moe.moe = MoeConfig{};
  moe.moe->num_local_experts = 2;
  moe.moe->num_experts_per_tok = 3;
  moe.moe->layers = {0};
  CHECK_THROWS_WITH(count_model(moe, 8), Catch::Contains("num_experts_per_tok=3 exceeds"));
}
