#include "checkpoint/hf_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "recipe/keys.h"
#include "recipe/recipe_json.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

nlohmann::json hf_config_json(const recipe::ModelConfig& m, const std::string& dtype) {
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"vocab_size", m.vocab_size},
                      {"hidden_size", m.hidden_size},
                      {"intermediate_size", m.intermediate_size},
                      {"num_hidden_layers", m.num_hidden_layers},
                      {"num_attention_heads", m.num_attention_heads},
                      {"num_key_value_heads", m.num_key_value_heads},
                      {"head_dim", m.head_dim},
                      {"hidden_act", "silu"},
                      {"rope_theta", m.rope_theta},
                      {"rms_norm_eps", m.rms_norm_eps},
                      {"max_position_embeddings", m.max_position_embeddings},
                      {"initializer_range", m.initializer_range},
                      {"tie_word_embeddings", m.tie_word_embeddings},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"torch_dtype", dtype == "bf16" ? "bfloat16" : "float32"}};
  // RoPE in both layouts: transformers 5 reads rope_parameters, older versions rope_theta and
  // rope_scaling; both describe the same rotation (read_hf_config checks that they agree).
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", m.rope_theta}};
  if (m.rope_scaling) {
    const auto& s = *m.rope_scaling;
    nlohmann::json scaling = {{"rope_type", s.rope_type}, {"factor", s.factor}};
    if (s.rope_type == "llama3") {
      scaling["low_freq_factor"] = s.low_freq_factor;
      scaling["high_freq_factor"] = s.high_freq_factor;
      scaling["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
    c["rope_scaling"] = scaling;
    rope = scaling;
    rope["rope_theta"] = m.rope_theta;
  }
  c["rope_parameters"] = rope;
  if (m.moe) {
    const auto& e = *m.moe;
    if (e.num_shared_experts > 0 || int64_t(e.layers.size()) != m.num_hidden_layers || e.capacity_factor)
      throw UserError("this MoE model has shared experts, dense layers or a capacity factor, which transformers' "
                      "Mixtral cannot express; export supports Llama and Mixtral-shaped models");
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["intermediate_size"] = e.moe_intermediate_size;
    c["num_local_experts"] = e.num_local_experts;
    c["num_experts_per_tok"] = e.num_experts_per_tok;
    c["router_aux_loss_coef"] = e.router_aux_loss_coef;
    c["output_router_logits"] = false;
    c["sliding_window"] = nullptr;
    c.erase("mlp_bias");
  }
  return c;
}

int export_hf(const LoadedCheckpoint& loaded, const std::string& out_dir, uint64_t max_shard_bytes) {
  std::vector<std::string> problems;
  const recipe::Recipe r = recipe::recipe_from_json(loaded.manifest().at("recipe"), problems);
  if (!problems.empty()) throw UserError(fmt::format("{}: the manifest's recipe is not valid: {}", loaded.path(), problems[0]));
  fs::create_directories(out_dir);
  {
    std::ofstream config(fs::path(out_dir) / "config.json");
    config << hf_config_json(r.model, r.training.dtype).dump(2) << "\n";
    if (!config) throw std::runtime_error(fmt::format("{}/config.json: cannot write", out_dir));
  }
  // The model's weights: every tensor that is not optimizer or RNG state.
  std::vector<std::string> names;
  for (const auto& [name, record] : loaded.manifest().at("tensors").items())
    if (name.rfind("model.", 0) == 0 || name == "lm_head.weight") names.push_back(name);
  std::vector<std::vector<SafetensorsEntry>> files(1);
  uint64_t in_current = 0;
  for (const auto& name : names) {
    at::Tensor t = loaded.read(name);
    if (in_current > 0 && in_current + t.nbytes() > max_shard_bytes) {
      files.emplace_back();
      in_current = 0;
    }
    files.back().push_back({name, t});
    in_current += t.nbytes();
  }
  if (files.size() == 1) {
    write_safetensors((fs::path(out_dir) / "model.safetensors").string(), files[0], {{"format", "pt"}});
    return 1;
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  uint64_t total = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, files.size());
    write_safetensors((fs::path(out_dir) / file).string(), files[i], {{"format", "pt"}});
    for (const auto& e : files[i]) {
      index["weight_map"][e.name] = file;
      total += e.tensor.nbytes();
    }
  }
  index["metadata"]["total_size"] = total;
  std::ofstream(fs::path(out_dir) / "model.safetensors.index.json") << index.dump(2) << "\n";
  return int(files.size());
}

void read_hf_weights(const std::string& dir, const std::function<void(const std::string&, const at::Tensor&)>& take) {
  const fs::path root(dir);
  std::vector<std::string> files;
  if (fs::exists(root / "model.safetensors.index.json")) {
    const auto index = read_json_file((root / "model.safetensors.index.json").string());
    std::set<std::string> unique;
    for (const auto& [name, file] : index.at("weight_map").items()) unique.insert(file.get<std::string>());
    files.assign(unique.begin(), unique.end());
  } else if (fs::exists(root / "model.safetensors")) {
    files = {"model.safetensors"};
  } else {
    throw UserError(fmt::format("{}: no model.safetensors or model.safetensors.index.json (Hugging Face weights in "
                                "safetensors format expected)", dir));
  }
  for (const auto& file : files) {
    const SafetensorsReader reader((root / file).string());
    for (const auto& name : reader.names()) take(name, reader.read(name));
  }
}

}  // namespace trainer::checkpoint
