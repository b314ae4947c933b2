#include "recipe/hf_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include "core/json_file.h"
#include "recipe/keys.h"
#include "recipe/validate.h"

namespace trainer::recipe {

namespace {

using nlohmann::json;
using Problem = std::function<void(const std::string&)>;

// Fields copied into model.* as they are (type-checked afterwards against the schema).
const char* const kModelFields[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                                    "tie_word_embeddings", "max_position_embeddings", "initializer_range"};
const char* const kMoeFields[] = {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"};
// Qwen3-MoE's own keys (read_hf_config's qwen3_moe branch); for other types they are unknown.
const std::set<std::string> kQwenMoeKeys = {"num_experts", "norm_topk_prob", "moe_intermediate_size",
                                            "decoder_sparse_step", "mlp_only_layers"};

// DeepSeek-V3's own keys (read_deepseek); for other types they are unknown. transformers ignores
// the training-time keys of DeepSeek's hub config (aux_loss_alpha, seq_aux, ep_size) and builds no
// multi-token-prediction modules (num_nextn_predict_layers, which trainer trains).
const std::set<std::string> kDeepseekKeys = {
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "qk_head_dim",
    "rope_interleave", "n_routed_experts", "num_local_experts", "n_shared_experts", "moe_intermediate_size",
    "num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
    "first_k_dense_replace", "scoring_func", "topk_method", "moe_layer_freq", "num_nextn_predict_layers",
    "num_mtp_layers", "aux_loss_alpha", "seq_aux", "ep_size", "quantization_config"};

// Keys read elsewhere in this file (RoPE, model type, the features checked below).
const std::set<std::string> kReadKeys = {"model_type", "rope_theta", "rope_scaling", "rope_parameters",
                                         "partial_rotary_factor", "original_max_position_embeddings",
                                         "hidden_act", "attention_bias", "mlp_bias", "sliding_window",
                                         "use_sliding_window", "max_window_layers", "layer_types",
                                         "attention_dropout", "router_jitter_noise"};

// Keys of llama/mistral/mixtral configs that cannot change what is trained: token ids, storage
// dtype, generation and output switches, bookkeeping. pretraining_tp only split the matmuls of
// transformers 4's forward (same result); output_router_logits only decides whether transformers
// adds the router loss to its own returned loss, which trainer always does with router_aux_loss_coef.
const std::set<std::string> kHarmlessKeys = {
    "architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype", "bos_token_id",
    "eos_token_id", "pad_token_id", "use_cache", "pretraining_tp", "output_router_logits",
    "output_attentions", "output_hidden_states", "return_dict", "tokenizer_class", "model_name",
    "is_decoder", "is_encoder_decoder", "add_cross_attention", "use_return_dict", "chunk_size_feed_forward",
    "problem_type", "id2label", "label2id", "task_specific_params", "finetuning_task"};

// RoPE as one of the two layouts describes it, resolved as transformers 5 resolves it: values in
// the dict first, then the top-level keys, then the defaults (theta 10000; llama3's original
// context falls back to max_position_embeddings).
struct Rope {
  json theta;                  // a JSON number (or whatever was written: the schema check reports it)
  json scaling = json(nullptr);  // model.rope_scaling, or null for rope_type default
};

std::optional<Rope> resolve_rope(const json& hf, const std::string& key, const Problem& problem) {
  const json& dict = hf.at(key);
  if (!dict.is_object()) {
    problem(fmt::format("{} {} is not supported; expected an object with rope_type", key, describe_json(dict)));
    return std::nullopt;
  }
  Rope rope;
  rope.theta = dict.contains("rope_theta") ? dict["rope_theta"] : hf.value("rope_theta", json(10000.0));
  const json partial = dict.contains("partial_rotary_factor") ? dict["partial_rotary_factor"]
                                                               : hf.value("partial_rotary_factor", json(1.0));
  if (!partial.is_number() || partial.get<double>() != 1.0)
    problem(fmt::format("{}.partial_rotary_factor {} is not supported; expected 1.0 (rotary on every dimension)", key,
                        describe_json(partial)));
  const json type_json = dict.contains("rope_type") ? dict["rope_type"] : dict.value("type", json("default"));
  const std::string type = type_json.is_string() ? type_json.get<std::string>() : describe_json(type_json);
  if (type == "default") return rope;
  if (type != "linear" && type != "llama3" && type != "yarn") {
    problem(fmt::format("{}.rope_type \"{}\" is not supported; expected default, linear, llama3 or yarn (trainer "
                        "does not implement it, and ignoring it would train a different model)",
                        key, type));
    return std::nullopt;
  }
  rope.scaling = {{"rope_type", type}};
  std::vector<const char*> required = {"factor"};
  if (type == "llama3") required.insert(required.end(), {"low_freq_factor", "high_freq_factor"});
  for (const char* name : required) {
    if (dict.contains(name))
      rope.scaling[name] = dict[name];
    else
      problem(fmt::format("{}: rope_type {} needs {}; it is missing", key, type, name));
  }
  if (type == "yarn") {
    // The ramp's context: the dict's, else the top level's (DeepSeek and Qwen give it in the dict).
    if (dict.contains("original_max_position_embeddings"))
      rope.scaling["original_max_position_embeddings"] = dict["original_max_position_embeddings"];
    else if (hf.contains("original_max_position_embeddings"))
      rope.scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"];
    else
      problem(fmt::format("{}: rope_type yarn needs original_max_position_embeddings; it is missing", key));
    for (const char* name : {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"})
      if (dict.contains(name) && !dict[name].is_null()) rope.scaling[name] = dict[name];
  }
  if (type == "llama3") {
    if (hf.contains("original_max_position_embeddings"))
      rope.scaling["original_max_position_embeddings"] = hf["original_max_position_embeddings"];
    else if (dict.contains("original_max_position_embeddings"))
      rope.scaling["original_max_position_embeddings"] = dict["original_max_position_embeddings"];
    else if (hf.contains("max_position_embeddings"))
      rope.scaling["original_max_position_embeddings"] = hf["max_position_embeddings"];
  }
  return rope;
}

// DeepSeek-V3 (transformers' DeepseekV3Config defaults where a key is missing): model.mla, and the
// layers from first_k_dense_replace on MoE with sigmoid scores, expert groups, shared experts and
// routed_scaling_factor. transformers trains it without a load-balancing loss and without updating
// the routing biases, so router_aux_loss_coef and bias_update_rate are 0 (set them in the recipe to
// train as DeepSeek did).
void read_deepseek(const json& hf, json& model, const Problem& problem) {
  json mla = json::object();
  mla["q_lora_rank"] = hf.value("q_lora_rank", json(1536));
  mla["kv_lora_rank"] = hf.value("kv_lora_rank", json(512));
  mla["qk_nope_head_dim"] = hf.value("qk_nope_head_dim", json(128));
  mla["qk_rope_head_dim"] = hf.value("qk_rope_head_dim", json(64));
  mla["v_head_dim"] = hf.value("v_head_dim", json(128));
  mla["rope_interleave"] = hf.value("rope_interleave", json(true));
  if (mla["rope_interleave"].is_null()) mla["rope_interleave"] = true;
  if (hf.contains("qk_head_dim") && mla["qk_nope_head_dim"].is_number_integer() &&
      mla["qk_rope_head_dim"].is_number_integer() &&
      hf["qk_head_dim"] != json(mla["qk_nope_head_dim"].get<int64_t>() + mla["qk_rope_head_dim"].get<int64_t>()))
    problem(fmt::format("qk_head_dim {} is not qk_nope_head_dim + qk_rope_head_dim ({} + {})",
                        describe_json(hf["qk_head_dim"]), describe_json(mla["qk_nope_head_dim"]),
                        describe_json(mla["qk_rope_head_dim"])));
  model["mla"] = mla;
  // transformers builds no MTP modules (it drops their weights); trainer trains them.
  model["num_nextn_predict_layers"] = hf.value("num_nextn_predict_layers", hf.value("num_mtp_layers", json(1)));
  model.erase("head_dim");  // transformers writes qk_rope_head_dim there; MLA's widths are model.mla's
  if (hf.contains("quantization_config") && !hf["quantization_config"].is_null())
    problem("quantization_config is set: the weights are quantized (DeepSeek-V3's FP8 release); trainer reads "
            "floating-point weights: dequantize them to bf16 first and remove quantization_config");
  for (const auto& [key, expected] : {std::pair<const char*, json>{"scoring_func", "sigmoid"},
                                      {"topk_method", "noaux_tc"}, {"moe_layer_freq", 1}})
    if (hf.contains(key) && hf[key] != expected)
      problem(fmt::format("{} {} is not supported; expected {} (DeepSeek-V3's routing, as transformers runs it)", key,
                          describe_json(hf[key]), describe_json(expected)));
  const json experts = hf.value("n_routed_experts", hf.value("num_local_experts", json(256)));
  if (experts.is_null()) return;  // a dense model
  json moe = json::object();
  moe["num_local_experts"] = experts;
  moe["num_shared_experts"] = hf.value("n_shared_experts", json(1));
  if (moe["num_shared_experts"].is_null()) moe["num_shared_experts"] = 0;
  moe["moe_intermediate_size"] = hf.value("moe_intermediate_size", json(2048));
  moe["num_experts_per_tok"] = hf.value("num_experts_per_tok", json(8));
  moe["n_group"] = hf.value("n_group", json(8));
  moe["topk_group"] = hf.value("topk_group", json(4));
  moe["norm_topk_prob"] = hf.value("norm_topk_prob", json(true));
  moe["routed_scaling_factor"] = hf.value("routed_scaling_factor", json(2.5));
  moe["scoring_func"] = "sigmoid";
  moe["router_aux_loss_coef"] = 0.0;
  const json first = hf.value("first_k_dense_replace", json(3));
  const json layer_count = hf.value("num_hidden_layers", json(61));
  const int64_t layers = layer_count.is_number_integer() ? layer_count.get<int64_t>() : 0;
  if (!first.is_number_integer() || first.get<int64_t>() < 0) {
    problem(fmt::format("first_k_dense_replace {} is not supported; expected an integer >= 0", describe_json(first)));
    return;
  }
  json moe_layers = json::array();
  for (int64_t l = first.get<int64_t>(); l < std::min(layers, kMaxHiddenLayers); ++l) moe_layers.push_back(l);
  if (moe_layers.empty()) return;  // every layer dense
  if (int64_t(moe_layers.size()) != layers) moe["layers"] = moe_layers;
  model["moe"] = moe;
}

// Fills model.rope_theta and model.rope_scaling from whichever layout the file uses.
void read_rope(const json& hf, json& model, const Problem& problem) {
  std::optional<Rope> found;
  std::string found_key;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!hf.contains(key) || hf[key].is_null()) continue;
    const auto rope = resolve_rope(hf, key, problem);
    if (!rope) return;
    if (found && (found->theta != rope->theta || found->scaling != rope->scaling)) {
      problem(fmt::format("{} and {} disagree (theta {} and {}, scaling {} and {}); keep one", found_key, key,
                          describe_json(found->theta), describe_json(rope->theta), describe_json(found->scaling),
                          describe_json(rope->scaling)));
      return;
    }
    found = rope;
    found_key = key;
  }
  if (!found) {
    if (hf.contains("partial_rotary_factor") &&
        !(hf["partial_rotary_factor"].is_number() && hf["partial_rotary_factor"].get<double>() == 1.0))
      problem(fmt::format("partial_rotary_factor {} is not supported; expected 1.0",
                          describe_json(hf["partial_rotary_factor"])));
    if (hf.contains("rope_theta") && !hf["rope_theta"].is_null()) model["rope_theta"] = hf["rope_theta"];
    return;
  }
  model["rope_theta"] = found->theta;
  if (!found->scaling.is_null()) model["rope_scaling"] = found->scaling;
}

// Features that change the arithmetic and that trainer does not implement.
void check_unsupported(const json& hf, const std::string& model_type, const Problem& problem) {
  if (hf.contains("hidden_act") && hf["hidden_act"] != "silu")
    problem(fmt::format("hidden_act {} is not supported; expected \"silu\" (SwiGLU)", describe_json(hf["hidden_act"])));
  // Llama's attention_bias puts a bias on o_proj too; Qwen2 has q, k and v biases without the key.
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (hf.contains(bias) && hf[bias] == true) problem(fmt::format("{} true is not supported; expected false", bias));
  // Sliding windows are read by read_window; other model types have no window in transformers.
  const bool windows = model_type == "mistral" || model_type == "mixtral" || model_type == "qwen2" ||
                       model_type == "qwen3" || model_type == "qwen3_moe";
  if (!windows && hf.contains("sliding_window") && !hf["sliding_window"].is_null())
    problem(fmt::format("sliding_window {} is not supported for model_type {}; expected null (transformers' {} has "
                        "no sliding window)",
                        describe_json(hf["sliding_window"]), model_type, model_type));
  // Qwen2/Qwen3 name each layer's attention in layer_types; Mistral, Mixtral and Qwen3-MoE window
  // every layer.
  const bool qwen = model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen3_moe";
  const bool layered = model_type == "qwen2" || model_type == "qwen3";
  if (!qwen && hf.contains("use_sliding_window") && hf["use_sliding_window"] == true)
    problem(fmt::format("use_sliding_window true is not supported for model_type {}; expected false (its "
                        "sliding_window applies to every layer)",
                        model_type));
  if (!layered && hf.contains("layer_types")) {
    const json& types = hf["layer_types"];
    const bool all_full = types.is_array() && std::all_of(types.begin(), types.end(), [](const json& t) {
      return t == "full_attention";
    });
    if (!all_full)
      problem(fmt::format("layer_types {} is not supported for model_type {}; expected \"full_attention\" for every "
                          "layer",
                          describe_json(types), model_type));
  }
  for (const char* rate : {"attention_dropout", "router_jitter_noise"}) {
    if (!hf.contains(rate) || hf[rate].is_null()) continue;
    if (!hf[rate].is_number() || hf[rate].get<double>() != 0.0)
      problem(fmt::format("{} {} is not supported; expected 0 (trainer has no {})", rate, describe_json(hf[rate]),
                          std::string(rate) == "attention_dropout" ? "dropout" : "router noise"));
  }
}

// model.sliding_window and model.sliding_window_layers as transformers applies them. Mistral and
// Mixtral: sliding_window on every layer. Qwen2, Qwen3 and Qwen3-MoE: only with use_sliding_window;
// Qwen2 and Qwen3 in the layers layer_types calls "sliding_attention" (written by transformers 5),
// or else in layers max_window_layers (default 28) and above, as Qwen2Config computes layer_types;
// Qwen3-MoE (whose config has neither) in every layer. A missing sliding_window is the config
// class's default: 4096, except Mixtral's (none).
void read_window(const json& hf, const std::string& model_type, json& model, const Problem& problem) {
  const bool qwen = model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen3_moe";
  const bool layered = model_type == "qwen2" || model_type == "qwen3";
  if (model_type != "mistral" && model_type != "mixtral" && !qwen) return;
  json window = hf.value("sliding_window", model_type == "mixtral" ? json(nullptr) : json(4096));
  if (qwen) {
    // Qwen2Config: sliding_window if use_sliding_window else None (a null or missing flag is off).
    const json use = hf.value("use_sliding_window", json(false));
    if (!use.is_boolean() && !use.is_null()) {
      problem(fmt::format("use_sliding_window {} is {}; expected true or false", describe_json(use),
                          json_type_name(use)));
      return;
    }
    if (use.is_null() || !use.get<bool>()) window = nullptr;
  }
  const json layer_count = hf.value("num_hidden_layers", json(0));
  const int64_t layers = layer_count.is_number_integer() ? layer_count.get<int64_t>() : 0;
  std::vector<int64_t> windowed;
  if (layered && hf.contains("layer_types") && !hf["layer_types"].is_null()) {
    const json& types = hf["layer_types"];
    if (!types.is_array() || (!window.is_null() && int64_t(types.size()) != layers)) {
      problem(fmt::format("layer_types {} is not a list of num_hidden_layers={} entries", describe_json(types), layers));
      return;
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "sliding_attention")
        windowed.push_back(int64_t(i));
      else if (types[i] != "full_attention")
        problem(fmt::format("layer_types[{}] {} is not supported; expected \"full_attention\" or "
                            "\"sliding_attention\"",
                            i, describe_json(types[i])));
    }
    if (!windowed.empty() && window.is_null())
      problem(fmt::format("layer_types has sliding_attention layers but no window (sliding_window {}, "
                          "use_sliding_window {}); transformers would attend to the whole context there: set "
                          "layer_types to full_attention or give the window",
                          describe_json(hf.value("sliding_window", json(nullptr))),
                          describe_json(hf.value("use_sliding_window", json(nullptr)))));
    if (windowed.empty()) return;
  } else if (layered && !window.is_null()) {
    const json first = hf.value("max_window_layers", json(28));
    if (!first.is_number_integer()) {
      problem(fmt::format("max_window_layers {} is {}; expected an integer", describe_json(first),
                          json_type_name(first)));
      return;
    }
    for (int64_t i = std::max<int64_t>(0, first.get<int64_t>()); i < layers; ++i) windowed.push_back(i);
    if (windowed.empty()) return;  // every layer below max_window_layers: full attention
  }
  if (window.is_null()) return;
  model["sliding_window"] = window;
  if (layered && int64_t(windowed.size()) != layers) model["sliding_window_layers"] = windowed;
}

}  // namespace

nlohmann::json read_hf_config(const std::string& path, std::vector<std::string>& problems,
                              std::vector<std::string>* warnings) {
  std::string file = path;
  std::error_code ec;  // a path that cannot be examined is reported by read_json_file
  if (std::filesystem::is_directory(file, ec)) file = (std::filesystem::path(file) / "config.json").string();
  const json hf = read_json_file(file);
  if (!hf.is_object()) {
    problems.push_back(fmt::format("model.hf_config {}: expected a JSON object", file));
    return json::object();
  }
  const Problem problem = [&](const std::string& text) {
    problems.push_back(fmt::format("model.hf_config {}: {}", file, text));
  };

  const json& type_json = hf.contains("model_type") ? hf["model_type"] : json("llama");
  const std::string model_type = type_json.is_string() ? type_json.get<std::string>() : describe_json(type_json);
  if (!type_json.is_string())
    problem(fmt::format("model_type {} is {}; expected a string: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe "
                        "or deepseek_v3", model_type, json_type_name(type_json)));
  else if (model_type != "llama" && model_type != "mistral" && model_type != "mixtral" && model_type != "qwen2" &&
           model_type != "qwen3" && model_type != "qwen3_moe" && model_type != "deepseek_v3")
    problem(fmt::format("model_type \"{}\" is not supported; expected llama, mistral, mixtral, qwen2, qwen3, "
                        "qwen3_moe or deepseek_v3 (write the model section by hand for other architectures)",
                        model_type));
  check_unsupported(hf, model_type, problem);

  json model = json::object();
  for (const char* name : kModelFields)
    if (hf.contains(name) && !hf[name].is_null()) model[name] = hf[name];
  read_rope(hf, model, problem);
  read_window(hf, model_type, model, problem);
  if (model_type == "qwen2") model["attention_bias"] = true;  // q, k and v: Qwen2Attention's bias=True
  if (model_type == "qwen3") {
    model["qk_norm"] = true;  // Qwen3Attention's q_norm and k_norm
    // Qwen3Config's head_dim defaults to 128, not hidden_size / num_attention_heads.
    if (!hf.contains("head_dim") || hf["head_dim"].is_null()) model["head_dim"] = 128;
  }
  if (model_type == "deepseek_v3") {
    read_deepseek(hf, model, problem);
  } else if (model_type == "qwen3_moe") {
    // Qwen3-MoE: Qwen3's attention (q/k norms; head_dim hidden / heads unless given, as
    // Qwen3MoeAttention reads it), experts of moe_intermediate_size, dense layers of
    // intermediate_size where mlp_only_layers or decoder_sparse_step say, top-k probabilities
    // renormalised only with norm_topk_prob (default false).
    model["qk_norm"] = true;
    json moe_section = json::object();
    // The Hub's configs say num_experts; transformers 5 saves it as num_local_experts.
    moe_section["num_local_experts"] = hf.value("num_local_experts", hf.value("num_experts", json(128)));
    moe_section["num_experts_per_tok"] = hf.value("num_experts_per_tok", json(8));
    moe_section["moe_intermediate_size"] = hf.value("moe_intermediate_size", json(768));
    moe_section["norm_topk_prob"] = hf.value("norm_topk_prob", json(false));
    moe_section["router_aux_loss_coef"] = hf.value("router_aux_loss_coef", json(0.001));
    const json step = hf.value("decoder_sparse_step", json(1));
    const json only = hf.value("mlp_only_layers", json(nullptr));
    const json layer_count = hf.value("num_hidden_layers", json(24));
    const int64_t layers = layer_count.is_number_integer() ? layer_count.get<int64_t>() : 0;
    if (!step.is_number_integer() || step.get<int64_t>() < 1)
      problem(fmt::format("decoder_sparse_step {} is not supported; expected an integer >= 1", describe_json(step)));
    else if (!only.is_null() && !only.is_array())
      problem(fmt::format("mlp_only_layers {} is {}; expected a list of layer indices", describe_json(only),
                          json_type_name(only)));
    else {
      // Qwen3MoeDecoderLayer: MoE where the layer is not in mlp_only_layers and
      // (layer + 1) % decoder_sparse_step == 0.
      json moe_layers = json::array();
      for (int64_t l = 0; l < std::min(layers, kMaxHiddenLayers); ++l) {
        bool dense = false;
        if (only.is_array())
          for (const json& d : only) dense = dense || (d.is_number_integer() && d.get<int64_t>() == l);
        if (!dense && (l + 1) % step.get<int64_t>() == 0) moe_layers.push_back(l);
      }
      if (int64_t(moe_layers.size()) != layers) moe_section["layers"] = moe_layers;
    }
    model["moe"] = moe_section;
  } else if (model_type == "mixtral" || hf.contains("num_local_experts")) {
    json moe_section = json::object();
    for (const char* name : kMoeFields)
      if (hf.contains(name)) moe_section[name] = hf[name];
    // Mixtral's intermediate_size is the width of each expert; every layer is MoE.
    if (hf.contains("intermediate_size")) moe_section["moe_intermediate_size"] = hf["intermediate_size"];
    model["moe"] = moe_section;
  }

  // Keys that are neither read nor known to be harmless: listed once, so nothing is dropped unseen.
  std::vector<std::string> unknown;
  for (const auto& [key, value] : hf.items()) {
    const bool read = kReadKeys.count(key) || std::find(std::begin(kModelFields), std::end(kModelFields), key) !=
                                                  std::end(kModelFields);
    const bool moe_key = std::find(std::begin(kMoeFields), std::end(kMoeFields), key) != std::end(kMoeFields) ||
                         (model_type == "qwen3_moe" && kQwenMoeKeys.count(key)) ||
                         (model_type == "deepseek_v3" && kDeepseekKeys.count(key));
    if (!read && !moe_key && !kHarmlessKeys.count(key)) unknown.push_back(key);
  }
  if (!unknown.empty() && warnings) {
    std::string list;
    for (const auto& key : unknown) list += (list.empty() ? "" : ", ") + key;
    warnings->push_back(fmt::format("model.hf_config {}: ignoring {} key{} trainer does not know: {} (check that "
                                    "{} not change the model)",
                                    file, unknown.size(), unknown.size() == 1 ? "" : "s", list,
                                    unknown.size() == 1 ? "it does" : "they do"));
  }

  json layer = {{"model", model}};
  // Type-check what we took, naming the file.
  std::vector<std::string> type_problems;
  check_document(layer, type_problems);
  for (const auto& p : type_problems) problem(p);
  // Sizes no machine holds, named here with the file they came from (validate_recipe checks them
  // again for recipes written by hand).
  if (type_problems.empty()) {
    const auto bound = [&](const std::string& key, const json& value) {
      if (!value.is_number_integer()) return;
      if (auto p = size_bound_problem(key, value.get<int64_t>())) problem(*p);
    };
    for (const auto& [key, value] : model.items()) bound("model." + key, value);
    if (model.contains("moe"))
      for (const auto& [key, value] : model["moe"].items()) bound("model.moe." + key, value);
    if (model.contains("rope_scaling") && model["rope_scaling"].contains("original_max_position_embeddings"))
      bound("model.rope_scaling.original_max_position_embeddings", model["rope_scaling"]["original_max_position_embeddings"]);
    if (model.contains("head_dim") && model["head_dim"].is_number_integer())
      if (auto p = head_dim_problem(model["head_dim"].get<int64_t>())) problem(*p);
  }
  return layer;
}

}  // namespace trainer::recipe
