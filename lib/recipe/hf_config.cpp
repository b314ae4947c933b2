#include "recipe/hf_config.h"

#include <fmt/format.h>

#include <filesystem>

#include "core/json_file.h"
#include "recipe/keys.h"

namespace trainer::recipe {

nlohmann::json read_hf_config(const std::string& path, std::vector<std::string>& problems) {
  std::string file = path;
  if (std::filesystem::is_directory(file)) file = (std::filesystem::path(file) / "config.json").string();
  const nlohmann::json hf = read_json_file(file);
  if (!hf.is_object()) {
    problems.push_back(fmt::format("model.hf_config {}: expected a JSON object", file));
    return nlohmann::json::object();
  }
  auto problem = [&](const std::string& text) { problems.push_back(fmt::format("model.hf_config {}: {}", file, text)); };

  const std::string model_type = hf.value("model_type", "llama");
  if (model_type != "llama" && model_type != "mistral" && model_type != "mixtral") {
    problem(fmt::format("model_type \"{}\" is not supported; expected llama, mistral or mixtral "
                        "(write the model section by hand for other architectures)", model_type));
  }
  if (hf.contains("hidden_act") && hf["hidden_act"] != "silu")
    problem(fmt::format("hidden_act {} is not supported; expected \"silu\" (SwiGLU)", describe_json(hf["hidden_act"])));
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (hf.contains(bias) && hf[bias] == true) problem(fmt::format("{} true is not supported; expected false", bias));
  if (hf.contains("sliding_window") && !hf["sliding_window"].is_null())
    problem(fmt::format("sliding_window {} is not supported; expected null (full causal attention)",
                        describe_json(hf["sliding_window"])));

  nlohmann::json model = nlohmann::json::object();
  for (const char* name : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta",
                           "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings", "initializer_range"}) {
    if (hf.contains(name) && !hf[name].is_null()) model[name] = hf[name];
  }
  if (hf.contains("rope_scaling") && !hf["rope_scaling"].is_null()) {
    const auto& scaling = hf["rope_scaling"];
    const std::string type = scaling.is_object() ? scaling.value("rope_type", scaling.value("type", "")) : "";
    if (type != "llama3" && type != "linear") {
      problem(fmt::format("rope_scaling {} is not supported; expected rope_type llama3 or linear", describe_json(scaling)));
    } else {
      nlohmann::json ours = {{"rope_type", type}};
      for (const char* name : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        if (scaling.contains(name)) ours[name] = scaling[name];
      model["rope_scaling"] = ours;
    }
  }
  if (model_type == "mixtral" || hf.contains("num_local_experts")) {
    nlohmann::json moe = nlohmann::json::object();
    for (const char* name : {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"})
      if (hf.contains(name)) moe[name] = hf[name];
    // Mixtral's intermediate_size is the width of each expert; every layer is MoE.
    if (hf.contains("intermediate_size")) moe["moe_intermediate_size"] = hf["intermediate_size"];
    model["moe"] = moe;
  }
  nlohmann::json layer = {{"model", model}};
  // Type-check what we took, naming the file.
  std::vector<std::string> type_problems;
  check_document(layer, type_problems);
  for (const auto& p : type_problems) problem(p);
  return layer;
}

}  // namespace trainer::recipe
