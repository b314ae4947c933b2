#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>

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
  CHECK(r.model.rope_scaling->rope_type == trainer::recipe::RopeType::Llama3);
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
    "sliding_window": 4096, "rope_scaling": {"rope_type": "dynamic"}, "vocab_size": "x"})");
  const auto problems = problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"("}})");
  const std::string file = dir.path() + "/config.json";
  CHECK(any_contains(problems, "model.hf_config " + file + ": model_type \"gpt2\" is not supported"));
  CHECK(any_contains(problems, "hidden_act \"gelu\" is not supported"));
  CHECK(any_contains(problems, "attention_bias true is not supported"));
  CHECK(any_contains(problems, "sliding_window 4096 is not supported"));
  CHECK(any_contains(problems, "rope_scaling.rope_type \"dynamic\" is not supported"));
  CHECK(any_contains(problems, "model.vocab_size: found \"x\" (a string)"));
}

TEST_CASE("a Qwen2 config gives q/k/v biases - its sliding window applies from max_window_layers when in use", "[recipe]") {
  TempDir dir;
  const std::string qwen2 = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": false, "sliding_window": 32768,
    "max_window_layers": 21, "attention_dropout": 0.0)";
  dir.write("config.json", qwen2 + R"(, "layer_types": ["full_attention", "full_attention"]})");
  const auto r = load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe;
  CHECK(r.model.attention_bias);
  CHECK(r.model.head_dim == 64);
  CHECK(r.model.tie_word_embeddings);
  CHECK(r.model.rope_theta == 1e6);
  CHECK_FALSE(r.model.sliding_window);  // use_sliding_window false: transformers attends to everything
  // Layers asking for a window that is off.
  dir.write("config.json", qwen2 + R"(, "layer_types": ["full_attention", "sliding_attention"]})");
  auto problems = problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"("}})");
  CHECK(any_contains(problems, "layer_types has sliding_attention layers but no window"));
  // In use, without layer_types: layers 21..23 (Qwen2Config's rule).
  std::string used = qwen2 + "}";
  used.replace(used.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  dir.write("config.json", used);
  const auto windowed = load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe;
  CHECK(windowed.model.sliding_window == 32768);
  CHECK(windowed.model.sliding_window_layers == std::vector<int64_t>{21, 22, 23});
  CHECK(windowed.model.window_of(20) == 0);
  CHECK(windowed.model.window_of(21) == 32768);
  // A multi-token prediction block attends as the last layer: windowed here, not when layer 23 is not.
  trainer::recipe::ModelConfig mtp = windowed.model;
  mtp.num_nextn_predict_layers = 2;
  CHECK(mtp.window_of(24) == 32768);
  CHECK(mtp.window_of(25) == 32768);
  mtp.sliding_window_layers = {21, 22};
  CHECK(mtp.window_of(24) == 0);
}

TEST_CASE("a Mistral config windows every layer", "[recipe]") {
  TempDir dir;
  dir.write("config.json", R"({"model_type": "mistral", "vocab_size": 1000, "hidden_size": 512,
    "intermediate_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4,
    "sliding_window": 4096})");
  const auto r = load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe;
  CHECK(r.model.sliding_window == 4096);
  CHECK(r.model.window_of(0) == 4096);
  CHECK(r.model.window_of(2) == 4096);
  // transformers' default window when the key is missing: MistralConfig's 4096.
  dir.write("config.json", R"({"model_type": "mistral", "vocab_size": 1000, "hidden_size": 512,
    "intermediate_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4})");
  CHECK(load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe.model.sliding_window == 4096);
  // Qwen3-MoE windows every layer when the window is on (its config has no layer_types or
  // max_window_layers: transformers ignores one that is there).
  dir.write("config.json", R"({"model_type": "qwen3_moe", "vocab_size": 1000, "hidden_size": 512,
    "intermediate_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4,
    "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "use_sliding_window": true,
    "sliding_window": 128, "max_window_layers": 2, "mlp_only_layers": [0]})");
  const auto moe = load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe.model;
  CHECK(moe.window_of(0) == 128);
  CHECK(moe.window_of(2) == 128);
  REQUIRE(moe.moe);
  CHECK(moe.moe->layers == std::vector<int64_t>{1, 2});
  CHECK_FALSE(moe.moe->norm_topk_prob);
  CHECK(moe.head_dim == 64);  // hidden / heads: Qwen3MoeAttention's default
  // Listed layers need a window.
  const auto problems =
      problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"(", "sliding_window": null,
        "sliding_window_layers": [1, 1, 5, 0]}})");
  CHECK(any_contains(problems, "model.sliding_window_layers contains 5, but the model has layers 0..2"));
  CHECK(any_contains(problems, "model.sliding_window_layers lists layer 1 twice"));
  CHECK(any_contains(problems, "model.sliding_window is null (no window)"));
}

TEST_CASE("a Qwen3 config gives per-head q/k norms and its own head_dim", "[recipe]") {
  TempDir dir;
  dir.write("config.json", R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": true, "attention_bias": false,
    "use_sliding_window": false, "sliding_window": null, "max_window_layers": 28, "attention_dropout": 0.0})");
  const auto r = load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe;
  CHECK(r.model.qk_norm);
  CHECK_FALSE(r.model.attention_bias);
  CHECK(r.model.head_dim == 128);  // not hidden / heads = 64
  // Without head_dim, transformers' Qwen3Config takes 128 (not hidden / heads) and so does trainer;
  // a null use_sliding_window is off, as in Qwen3Config (sliding_window if use_sliding_window).
  dir.write("config.json", R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "use_sliding_window": null,
    "sliding_window": 4096})");
  CHECK_FALSE(load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe.model.sliding_window);
  dir.write("config.json", R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 512, "intermediate_size": 1024,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4})");
  CHECK(load_text(R"({"model": {"hf_config": ")" + dir.path() + R"("}})", dir.path()).recipe.model.head_dim == 128);
}

TEST_CASE("a missing or malformed hf_config file is a user error naming it", "[recipe]") {
  TempDir dir;
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": "/nonexistent/c.json"}})"),
                     "/nonexistent/c.json: cannot open file"));
  const std::string bad = dir.write("config.json", "{\"vocab_size\": }");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + bad + R"("}})"),
                     bad + ":1:16: malformed JSON"));
}

namespace {
// The same Llama 3 model as kLlamaConfig, in the layout transformers 5 writes.
const char* kLlamaConfigV5 = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "max_position_embeddings": 131072, "tie_word_embeddings": false, "attention_bias": false,
  "rope_parameters": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 500000.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "dtype": "bfloat16", "bos_token_id": 128000, "transformers_version": "5.23.0", "use_cache": true
})";
// A complete small recipe whose model section also names an HF config (the recipe's fields win).
trainer::recipe::LoadedRecipe load_with_hf(const std::string& hf_config, const std::string& dir) {
  return load_text(R"({"model": {"hf_config": ")" + hf_config + R"(", "vocab_size": 1024, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4},
    "training": {"seq_len": 256, "micro_batch_size": 2, "global_batch_size": 32, "steps": 100}})",
                   dir);
}
}  // namespace

TEST_CASE("transformers 5's rope_parameters and the old rope_theta/rope_scaling resolve to the same recipe",
          "[recipe]") {
  TempDir dir;
  dir.write("old/config.json", kLlamaConfig);
  dir.write("new/config.json", kLlamaConfigV5);
  const auto old_layout = load_text(R"({"model": {"hf_config": "old"}})", dir.path());
  const auto new_layout = load_text(R"({"model": {"hf_config": "new"}})", dir.path());
  CHECK(new_layout.recipe.model.rope_theta == 500000.0);
  REQUIRE(new_layout.recipe.model.rope_scaling);
  CHECK(new_layout.recipe.model.rope_scaling->rope_type == trainer::recipe::RopeType::Llama3);
  CHECK(new_layout.recipe.model.rope_scaling->factor == 8.0);
  auto without_source = [](nlohmann::json resolved) {
    resolved["model"].erase("hf_config");  // the two files' paths
    return resolved;
  };
  CHECK(without_source(new_layout.resolved) == without_source(old_layout.resolved));
  CHECK(new_layout.warnings.empty());  // every key is read or known to be harmless

  // rope_type default: a theta only; linear: a factor.
  dir.write("default.json", R"({"rope_parameters": {"rope_type": "default", "rope_theta": 1234.5}})");
  const auto plain = load_with_hf("default.json", dir.path()).recipe.model;
  CHECK(plain.rope_theta == 1234.5);
  CHECK_FALSE(plain.rope_scaling);
  dir.write("linear.json", R"({"rope_theta": 777.0, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})");
  const auto linear = load_with_hf("linear.json", dir.path()).recipe.model;
  CHECK(linear.rope_theta == 777.0);  // the top-level theta when the dict has none, as transformers does
  REQUIRE(linear.rope_scaling);
  CHECK(linear.rope_scaling->rope_type == trainer::recipe::RopeType::Linear);
  CHECK(linear.rope_scaling->factor == 2.0);
  // llama3 without original_max_position_embeddings falls back to max_position_embeddings (transformers' rule).
  dir.write("l3.json", R"({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "llama3",
    "rope_theta": 5e5, "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})");
  const auto l3 = load_with_hf("l3.json", dir.path()).recipe.model;
  REQUIRE(l3.rope_scaling);
  CHECK(l3.rope_scaling->original_max_position_embeddings == 4096);
}

TEST_CASE("RoPE types and features trainer cannot honour are errors naming the file and key", "[recipe]") {
  TempDir dir;
  const std::string file = dir.write("config.json", R"({"model_type": "mixtral",
    "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e6, "factor": 4.0},
    "router_jitter_noise": 0.1, "attention_dropout": 0.1, "use_sliding_window": true})");
  const auto problems = problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + file + R"("}})");
  CHECK(any_contains(problems, "model.hf_config " + file + ": rope_parameters.rope_type \"longrope\" is not supported"));
  CHECK(any_contains(problems, "router_jitter_noise 0.1 is not supported"));
  CHECK(any_contains(problems, "attention_dropout 0.1 is not supported"));
  CHECK(any_contains(problems, "use_sliding_window true is not supported"));
  for (const char* type : {"dynamic", "longrope", "proportional"}) {
    dir.write("t.json", fmt::format(R"({{"rope_parameters": {{"rope_type": "{}", "factor": 2.0}}}})", type));
    CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"(/t.json"}})"),
                       fmt::format("rope_type \"{}\" is not supported", type)));
  }
  dir.write("partial.json", R"({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}})");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"(/partial.json"}})"),
                     "partial_rotary_factor 0.5 is not supported"));
  // YaRN with DeepSeek-V3's fields is read whole; without its original context it is refused.
  dir.write("yarn.json", R"({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 40,
    "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
    "mscale_all_dim": 1.0}})");
  const auto yarn = load_with_hf("yarn.json", dir.path()).recipe.model;
  REQUIRE(yarn.rope_scaling);
  CHECK(yarn.rope_scaling->rope_type == trainer::recipe::RopeType::Yarn);
  CHECK(yarn.rope_scaling->factor == 40);
  CHECK(yarn.rope_scaling->original_max_position_embeddings == 4096);
  CHECK(yarn.rope_scaling->mscale_all_dim == 1.0);
  CHECK_FALSE(yarn.rope_scaling->attention_factor);
  dir.write("yarn-bare.json", R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"(/yarn-bare.json"}})"),
                     "rope_type yarn needs original_max_position_embeddings"));
  dir.write("missing.json", R"({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}})");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"(/missing.json"}})"),
                     "rope_parameters: rope_type llama3 needs low_freq_factor"));
  dir.write("both.json", R"({"rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}})");
  CHECK(any_contains(problems_of({}, std::nullopt, R"({"model": {"hf_config": ")" + dir.path() + R"(/both.json"}})"),
                     "rope_parameters and rope_scaling disagree"));
}

TEST_CASE("keys of an HF config that trainer neither reads nor knows are listed in one warning", "[recipe]") {
  TempDir dir;
  dir.write("config.json", R"({"model_type": "llama", "vocab_size": 1024, "use_cache": false,
    "fancy_new_norm": true, "qk_layernorm": true, "dtype": "float32"})");
  const auto loaded = load_with_hf("config.json", dir.path());
  REQUIRE(loaded.warnings.size() == 1);
  CHECK(loaded.warnings[0].find("ignoring 2 keys trainer does not know: fancy_new_norm, qk_layernorm") !=
        std::string::npos);
}

TEST_CASE("DeepSeek-V3's hub config gives latent attention - YaRN - grouped sigmoid experts - an MTP module - and "
          "its FP8 release is refused",
          "[recipe]") {
  TempDir dir;
  // deepseek-ai/DeepSeek-V3-Base's config.json (transformers 4 layout), without its auto_map.
  const std::string hub = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, QUANTIZATION "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})";
  auto with_quantization = [&](const std::string& q) {
    std::string text = hub;
    text.replace(text.find("QUANTIZATION"), 12, q);
    return text;
  };
  dir.write("config.json", with_quantization(""));
  const std::string recipe = R"({"model": {"hf_config": ")" + dir.path() + R"("}})";
  const auto r = load_text(recipe, dir.path()).recipe;
  REQUIRE(r.model.mla);
  CHECK(r.model.mla->q_lora_rank == 1536);
  CHECK(r.model.mla->kv_lora_rank == 512);
  CHECK(r.model.mla->qk_head_dim() == 192);
  CHECK(r.model.mla->rope_interleave);
  CHECK(r.model.rotary_dim() == 64);
  REQUIRE(r.model.rope_scaling);
  CHECK(r.model.rope_scaling->rope_type == trainer::recipe::RopeType::Yarn);
  CHECK(r.model.mla_softmax_factor() == Approx(std::pow(0.1 * std::log(40.0) + 1.0, 2)));
  REQUIRE(r.model.moe);
  CHECK(r.model.moe->num_local_experts == 256);
  CHECK(r.model.moe->num_shared_experts == 1);
  CHECK(r.model.moe->scoring_func == trainer::recipe::ScoringFunc::Sigmoid);
  CHECK(r.model.moe->n_group == 8);
  CHECK(r.model.moe->topk_group == 4);
  CHECK(r.model.moe->routed_scaling_factor == 2.5);
  CHECK(r.model.moe->router_aux_loss_coef == 0.0);  // transformers trains without one
  CHECK(r.model.moe->layers.size() == 58);
  CHECK(r.model.moe->layers.front() == 3);
  CHECK(r.model.num_nextn_predict_layers == 1);
  CHECK(r.model.routed_layers().back() == 61);  // the MTP module's block is MoE, as layer 60
  dir.write("config.json", with_quantization(R"("quantization_config": {"activation_scheme": "dynamic", )"
                                             R"("fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},)"));
  const auto problems = problems_of({}, std::nullopt, recipe);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("quantization_config") != std::string::npos);
  CHECK(problems[0].find("dequantize") != std::string::npos);
}
