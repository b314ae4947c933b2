// Hugging Face names of other families (checkpoint/hf_names.h) and the config.json export writes
// for them (hf_export.h): Qwen3-MoE's expert names both ways, Mistral's and Qwen2's windows, and
// the MoE models transformers' Mixtral cannot express refused.
#include <catch2/catch.hpp>

#include "checkpoint/hf_export.h"
#include "checkpoint/hf_names.h"
#include "core/error.h"

using namespace trainer;

namespace {

recipe::ModelConfig small_model() {
  recipe::ModelConfig m;
  m.vocab_size = 100;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_hidden_layers = 3;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 8;
  for (int64_t l = 0; l < 3; ++l) m.sliding_window_layers.push_back(l);
  return m;
}

recipe::ModelConfig qwen3_moe() {
  recipe::ModelConfig m = small_model();
  m.qk_norm = true;
  m.moe.emplace();
  m.moe->num_local_experts = 4;
  m.moe->moe_intermediate_size = 16;
  m.moe->norm_topk_prob = false;
  m.moe->layers = {1, 2};
  return m;
}

}  // namespace

TEST_CASE("Qwen3-MoE names: the MoE block is mlp and the experts' projections gate_proj up_proj down_proj",
          "[checkpoint]") {
  const recipe::ModelConfig m = qwen3_moe();
  const std::pair<const char*, const char*> names[] = {
      {"model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.mlp.gate.weight"},
      {"model.layers.1.block_sparse_moe.experts.3.w1.weight", "model.layers.1.mlp.experts.3.gate_proj.weight"},
      {"model.layers.2.block_sparse_moe.experts.0.w3.weight", "model.layers.2.mlp.experts.0.up_proj.weight"},
      {"model.layers.2.block_sparse_moe.experts.10.w2.weight", "model.layers.2.mlp.experts.10.down_proj.weight"},
      // Unchanged: a dense layer's MLP, attention, norms, embedding.
      {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"},
      {"model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.q_norm.weight"},
      {"model.embed_tokens.weight", "model.embed_tokens.weight"}};
  for (const auto& [ours, theirs] : names) {
    INFO(ours);
    CHECK(checkpoint::hf_name(ours, m) == theirs);
    CHECK(checkpoint::trainer_name(theirs, m) == ours);
  }
  // Mixtral-shaped models (no q/k norms) keep trainer's names, which are Mixtral's.
  recipe::ModelConfig mixtral = m;
  mixtral.qk_norm = false;
  CHECK(checkpoint::hf_name("model.layers.1.block_sparse_moe.experts.3.w1.weight", mixtral) ==
        "model.layers.1.block_sparse_moe.experts.3.w1.weight");
  CHECK(checkpoint::trainer_name("model.layers.1.mlp.gate.weight", mixtral) == "model.layers.1.mlp.gate.weight");
}

TEST_CASE("export config: Qwen3-MoE with its dense layers - Mistral and Qwen2 windows - what Mixtral cannot express",
          "[checkpoint]") {
  const auto c = checkpoint::hf_config_json(qwen3_moe(), recipe::Precision::FP32);
  CHECK(c["model_type"] == "qwen3_moe");
  CHECK(c["num_experts"] == 4);
  CHECK(c["norm_topk_prob"] == false);
  CHECK(c["mlp_only_layers"] == nlohmann::json::array({0}));
  CHECK(c["intermediate_size"] == 64);  // the dense layer's width
  CHECK(c["moe_intermediate_size"] == 16);

  recipe::ModelConfig mistral = small_model();
  mistral.sliding_window = 7;
  const auto mc = checkpoint::hf_config_json(mistral, recipe::Precision::FP32);
  CHECK(mc["model_type"] == "mistral");
  CHECK(mc["sliding_window"] == 7);

  recipe::ModelConfig qwen2 = mistral;
  qwen2.attention_bias = true;
  qwen2.sliding_window_layers = {1, 2};
  const auto qc = checkpoint::hf_config_json(qwen2, recipe::Precision::FP32);
  CHECK(qc["model_type"] == "qwen2");
  CHECK(qc["use_sliding_window"] == true);
  CHECK(qc["max_window_layers"] == 1);
  CHECK(qc["layer_types"] == nlohmann::json::array({"full_attention", "sliding_attention", "sliding_attention"}));
  qwen2.sliding_window_layers = {0, 2};  // not all layers from one on
  CHECK_THROWS_AS(checkpoint::hf_config_json(qwen2, recipe::Precision::FP32), UserError);
  mistral.sliding_window_layers = {0};  // Mistral windows every layer
  CHECK_THROWS_AS(checkpoint::hf_config_json(mistral, recipe::Precision::FP32), UserError);

  recipe::ModelConfig mixtral = qwen3_moe();
  mixtral.qk_norm = false;
  mixtral.moe->layers = {0, 1, 2};
  CHECK_THROWS_WITH(checkpoint::hf_config_json(mixtral, recipe::Precision::FP32),
                    Catch::Contains("unnormalised top-k"));  // norm_topk_prob false
  mixtral.moe->norm_topk_prob = true;
  CHECK(checkpoint::hf_config_json(mixtral, recipe::Precision::FP32)["model_type"] == "mixtral");
}
