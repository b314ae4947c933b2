#include "checkpoint/hf_export.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/hf_names.h"
#include "checkpoint/manifest_check.h"
#include "checkpoint/synced_file.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/regular_file.h"
#include "recipe/keys.h"
#include "recipe/recipe_json.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

namespace {

// DeepSeek-V3 (transformers' DeepseekV3ForCausalLM): latent attention; the layers from
// first_k_dense_replace on are MoE with sigmoid scores and shared experts; a dense model says
// first_k_dense_replace = its layer count.
nlohmann::json deepseek_config(nlohmann::json c, const recipe::ModelConfig& m) {
  const auto& a = *m.mla;
  c["architectures"] = {"DeepseekV3ForCausalLM"};
  c["model_type"] = "deepseek_v3";
  for (const char* key : {"mlp_bias", "head_dim"}) c.erase(key);
  c["q_lora_rank"] = a.q_lora_rank ? nlohmann::json(*a.q_lora_rank) : nlohmann::json(nullptr);
  c["kv_lora_rank"] = a.kv_lora_rank;
  c["qk_nope_head_dim"] = a.qk_nope_head_dim;
  c["qk_rope_head_dim"] = a.qk_rope_head_dim;
  c["v_head_dim"] = a.v_head_dim;
  c["rope_interleave"] = a.rope_interleave;
  c["num_key_value_heads"] = m.num_attention_heads;
  c["num_nextn_predict_layers"] = m.num_nextn_predict_layers;
  c["first_k_dense_replace"] = m.num_hidden_layers;
  if (!m.moe) return c;
  const auto& e = *m.moe;
  int64_t first = m.num_hidden_layers;
  for (const int64_t l : e.layers) first = std::min(first, l);
  if (int64_t(e.layers.size()) != m.num_hidden_layers - first || e.capacity_factor ||
      e.scoring_func != recipe::ScoringFunc::Sigmoid)
    throw UserError("this DeepSeek-V3-shaped model (model.mla with experts) has MoE layers that are not all the layers "
                    "from one on, a capacity factor or softmax scores, which transformers' DeepSeek-V3 cannot express "
                    "(first_k_dense_replace dense layers, then MoE with sigmoid scores, dropless)");
  c["first_k_dense_replace"] = first;
  c["n_routed_experts"] = e.num_local_experts;
  c["n_shared_experts"] = e.num_shared_experts;
  c["num_experts_per_tok"] = e.num_experts_per_tok;
  c["moe_intermediate_size"] = e.moe_intermediate_size;
  c["n_group"] = e.n_group;
  c["topk_group"] = e.topk_group;
  c["norm_topk_prob"] = e.norm_topk_prob;
  c["routed_scaling_factor"] = e.routed_scaling_factor;
  return c;
}

}  // namespace

nlohmann::json hf_config_json(const recipe::ModelConfig& m, recipe::Precision dtype) {
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
                      {"torch_dtype", dtype == recipe::Precision::BF16 ? "bfloat16" : "float32"}};
  // RoPE in both layouts: transformers 5 reads rope_parameters, older versions rope_theta and
  // rope_scaling; both describe the same rotation (read_hf_config checks that they agree).
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", m.rope_theta}};
  if (m.rope_scaling) {
    const auto& s = *m.rope_scaling;
    nlohmann::json scaling = {{"rope_type", recipe::name_of(s.rope_type)}, {"factor", s.factor}};
    if (s.rope_type == recipe::RopeType::Llama3) {
      scaling["low_freq_factor"] = s.low_freq_factor;
      scaling["high_freq_factor"] = s.high_freq_factor;
      scaling["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
    if (s.rope_type == recipe::RopeType::Yarn) {
      scaling["original_max_position_embeddings"] = s.original_max_position_embeddings;
      scaling["beta_fast"] = s.beta_fast;
      scaling["beta_slow"] = s.beta_slow;
      scaling["truncate"] = s.truncate;
      if (s.mscale) scaling["mscale"] = *s.mscale;
      if (s.mscale_all_dim) scaling["mscale_all_dim"] = *s.mscale_all_dim;
      if (s.attention_factor) scaling["attention_factor"] = *s.attention_factor;
    }
    c["rope_scaling"] = scaling;
    rope = scaling;
    rope["rope_theta"] = m.rope_theta;
  }
  c["rope_parameters"] = rope;
  if (m.qk_norm) {
    // Qwen3: per-head q/k norms; its attention_bias would put a bias on o_proj too.
    if (m.attention_bias)
      throw UserError("this model has q/k norms (model.qk_norm) together with q/k/v biases, which no transformers "
                      "architecture trainer exports expresses; export supports Llama-, Mistral-, Qwen2-, Qwen3-, "
                      "Qwen3-MoE- and Mixtral-shaped models");
    c["architectures"] = {"Qwen3ForCausalLM"};
    c["model_type"] = "qwen3";
    c.erase("mlp_bias");
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
  }
  if (m.attention_bias) {
    // Qwen2: q, k and v with biases, o_proj without (Llama's attention_bias would add one there).
    if (m.moe)
      throw UserError("this MoE model has q/k/v biases (model.attention_bias), which transformers' Mixtral cannot "
                      "express; export supports Llama-, Qwen2- and Mixtral-shaped models");
    c["architectures"] = {"Qwen2ForCausalLM"};
    c["model_type"] = "qwen2";
    c.erase("attention_bias");
    c.erase("mlp_bias");
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
  }
  // Sliding windows: Mistral (a Llama shape) and Mixtral window every layer; Qwen2 and Qwen3 the
  // layers from max_window_layers on (layer_types for transformers 5).
  const bool windowed = m.sliding_window.has_value();
  const bool every_layer = int64_t(m.sliding_window_layers.size()) == m.num_hidden_layers;
  if (windowed && m.qk_norm && m.moe) {
    // Qwen3-MoE windows every layer (its config has no layer_types or max_window_layers).
    if (!every_layer)
      throw UserError("this Qwen3-MoE-shaped model has a sliding window in some layers only "
                      "(model.sliding_window_layers), which transformers' Qwen3-MoE cannot express (it windows "
                      "every layer)");
    c["use_sliding_window"] = true;
    c["sliding_window"] = *m.sliding_window;
  } else if (windowed && (m.attention_bias || m.qk_norm)) {
    int64_t first = m.num_hidden_layers;
    for (const int64_t l : m.sliding_window_layers) first = std::min(first, l);
    if (int64_t(m.sliding_window_layers.size()) != m.num_hidden_layers - first)
      throw UserError("this model's sliding window is in layers that are not all the layers from one on "
                      "(model.sliding_window_layers), which Qwen2's max_window_layers cannot express");
    nlohmann::json types = nlohmann::json::array();
    for (int64_t l = 0; l < m.num_hidden_layers; ++l) types.push_back(l < first ? "full_attention" : "sliding_attention");
    c["use_sliding_window"] = true;
    c["sliding_window"] = *m.sliding_window;
    c["max_window_layers"] = first;
    c["layer_types"] = types;
  } else if (windowed) {
    if (!every_layer)
      throw UserError("this model has a sliding window in some layers only (model.sliding_window_layers), which "
                      "transformers' Mistral and Mixtral cannot express (they window every layer)");
    if (!m.moe) {
      c["architectures"] = {"MistralForCausalLM"};
      c["model_type"] = "mistral";
      c.erase("attention_bias");
      c.erase("mlp_bias");
    }
    c["sliding_window"] = *m.sliding_window;
  }
  if (m.mla) return deepseek_config(std::move(c), m);
  if (m.moe && m.qk_norm) {
    // Qwen3-MoE (hf_names.h): softmax scores, top-k renormalised by norm_topk_prob, dense layers
    // (of intermediate_size) where mlp_only_layers says.
    const auto& e = *m.moe;
    if (e.num_shared_experts > 0 || e.capacity_factor || e.scoring_func != recipe::ScoringFunc::Softmax ||
        e.n_group != 1 || e.routed_scaling_factor != 1.0 || e.bias_update_rate > 0)
      throw UserError("this Qwen3-MoE-shaped model (q/k norms with experts) has shared experts, a capacity factor, "
                      "sigmoid scores, expert groups, a routed scaling factor or routing biases, which transformers' "
                      "Qwen3-MoE cannot express");
    nlohmann::json dense = nlohmann::json::array();
    for (int64_t l = 0; l < m.num_hidden_layers; ++l)
      if (!m.is_moe_layer(l)) dense.push_back(l);
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["model_type"] = "qwen3_moe";
    c["num_experts"] = e.num_local_experts;
    c["num_experts_per_tok"] = e.num_experts_per_tok;
    c["moe_intermediate_size"] = e.moe_intermediate_size;
    c["norm_topk_prob"] = e.norm_topk_prob;
    c["router_aux_loss_coef"] = e.router_aux_loss_coef;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = dense;
    c["output_router_logits"] = false;
    return c;
  }
  if (m.moe) {
    const auto& e = *m.moe;
    if (e.num_shared_experts > 0 || int64_t(e.layers.size()) != m.num_hidden_layers || e.capacity_factor ||
        !e.norm_topk_prob || e.scoring_func != recipe::ScoringFunc::Softmax || e.n_group != 1 ||
        e.routed_scaling_factor != 1.0 || e.bias_update_rate > 0)
      throw UserError("this MoE model has shared experts, dense layers, a capacity factor, unnormalised top-k "
                      "weights, sigmoid scores, expert groups, a routed scaling factor or routing biases, which "
                      "transformers' Mixtral cannot express; export supports Llama-, Mistral-, Qwen2-, Qwen3-, "
                      "Qwen3-MoE- and Mixtral-shaped models");
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["intermediate_size"] = e.moe_intermediate_size;
    c["num_local_experts"] = e.num_local_experts;
    c["num_experts_per_tok"] = e.num_experts_per_tok;
    c["router_aux_loss_coef"] = e.router_aux_loss_coef;
    c["output_router_logits"] = false;
    c["sliding_window"] = windowed ? nlohmann::json(*m.sliding_window) : nlohmann::json(nullptr);
    c.erase("mlp_bias");
  }
  return c;
}

namespace {

// Where a file of the export is written before it replaces the old one: in the same directory,
// so that the rename is atomic and a reader sees the old file or the new one, never a part.
fs::path temporary_for(const fs::path& path) { return path.string() + ".tmp"; }

void replace_with(const fs::path& temporary, const fs::path& path) {
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot rename {} to it: {}", path.string(), temporary.string(), ec.message()));
}

// The files of an export, written under temporary names and renamed into place together only once
// all are on disk: a write that fails (a full disk) leaves an earlier export whole, not new files
// mixed with old ones. Temporaries not renamed are removed when this goes out of scope.
class StagedFiles {
 public:
  explicit StagedFiles(fs::path dir) : dir_(std::move(dir)) {}
  ~StagedFiles() {
    std::error_code ignored;
    for (const auto& name : names_) fs::remove(temporary_for(dir_ / name), ignored);
  }
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;

  // Where to write the file `name` of the directory.
  fs::path stage(const std::string& name) {
    names_.push_back(name);
    return temporary_for(dir_ / name);
  }
  void rename_into_place() {
    for (const auto& name : names_) replace_with(temporary_for(dir_ / name), dir_ / name);
    names_.clear();
  }

 private:
  fs::path dir_;
  std::vector<std::string> names_;
};

// The output directory is a directory or is missing; anything else of that name is the user's mistake.
void check_output_dir(const std::string& out_dir) {
  std::error_code ec;
  const auto status = fs::status(out_dir, ec);
  if (fs::exists(status) && !fs::is_directory(status))
    throw UserError(fmt::format("{}: exists and is not a directory; --hf names the directory to write config.json and "
                                "the safetensors files into",
                                out_dir));
}

void create_output_dir(const std::string& out_dir) {
  check_output_dir(out_dir);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw UserError(fmt::format("{}: cannot create the output directory: {}", out_dir, ec.message()));
}

}  // namespace

int export_hf(const LoadedCheckpoint& loaded, const std::string& out_dir, uint64_t max_shard_bytes) {
  // Everything that can be refused is checked, and every tensor read, before the first byte is
  // written: a refused export leaves an earlier export in out_dir as it was.
  const recipe::Recipe r = manifest_recipe(loaded.manifest(), loaded.path() + "/manifest.json");
  const std::string config = hf_config_json(r.model, r.training.dtype).dump(2) + "\n";
  check_output_dir(out_dir);  // before the (long) reads
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
    files.back().push_back({hf_name(name, r.model), t});
    in_current += t.nbytes();
  }
  // DeepSeek's multi-token prediction modules carry copies of the shared embedding and LM head.
  for (int64_t k = 0; k < r.model.num_nextn_predict_layers; ++k) {
    const std::string prefix = "model.layers." + std::to_string(r.model.num_hidden_layers + k) + ".";
    files.back().push_back({prefix + "embed_tokens.weight", loaded.read("model.embed_tokens.weight")});
    files.back().push_back({prefix + "shared_head.head.weight",
                            loaded.read(r.model.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight")});
  }
  // DeepSeek-V3's routing biases: the checkpoint's table (zeros when it has none), in fp32 as
  // transformers keeps them.
  if (r.model.mla && r.model.moe) {
    const nlohmann::json& extra = loaded.manifest().value("extra", nlohmann::json::object());
    const nlohmann::json table = extra.value("moe_routing_bias", nlohmann::json::object());
    for (const int64_t layer : r.model.routed_layers()) {
      const std::string key = std::to_string(layer);
      std::vector<float> values(size_t(r.model.moe->num_local_experts), 0.0f);
      if (table.contains(key)) values = table.at(key).get<std::vector<float>>();
      if (int64_t(values.size()) != r.model.moe->num_local_experts)
        throw UserError(fmt::format("{}: extra.moe_routing_bias.{} has {} values for {} experts", loaded.path(), key,
                                    values.size(), r.model.moe->num_local_experts));
      files.back().push_back({routing_bias_name(layer), at::tensor(values, at::kFloat)});
    }
  }

  create_output_dir(out_dir);
  const fs::path out(out_dir);
  StagedFiles staged(out);
  write_text_synced(staged.stage("config.json").string(), config);
  // A weights file of an earlier export in the other layout is removed: readers would take it.
  std::string stale = "model.safetensors.index.json";
  if (files.size() == 1) {
    write_safetensors(staged.stage("model.safetensors").string(), files[0], {{"format", "pt"}});
  } else {
    stale = "model.safetensors";
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    uint64_t total = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, files.size());
      write_safetensors(staged.stage(file).string(), files[i], {{"format", "pt"}});
      for (const auto& e : files[i]) {
        index["weight_map"][e.name] = file;
        total += e.tensor.nbytes();
      }
    }
    index["metadata"]["total_size"] = total;
    write_text_synced(staged.stage("model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  staged.rename_into_place();
  std::error_code ignored;
  fs::remove(out / stale, ignored);
  fsync_path(out.string());
  return int(files.size());
}

namespace {

// The weight files an index names, checked: weight_map is an object of plain file names inside
// `root` (never an absolute path or one with '/' or '..': a model directory from the internet must
// not make trainer read other files). Returns file -> the tensors the index puts in it.
std::map<std::string, std::set<std::string>> index_files(const fs::path& root) {
  const std::string path = (root / "model.safetensors.index.json").string();
  const auto index = read_json_file(path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw UserError(fmt::format("{}: expected an object with weight_map, an object of tensor name -> file name", path));
  std::map<std::string, std::set<std::string>> files;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string())
      throw UserError(fmt::format("{}: weight_map.{} is {} ({}), expected a file name", path, name, describe_json(file),
                                  json_type_name(file)));
    const std::string file_name = file.get<std::string>();
    if (!is_plain_file_name(file_name))
      throw UserError(fmt::format("{}: weight_map.{} is \"{}\", expected the name of a file in {} (no '/', not '..')",
                                  path, name, file_name, root.string()));
    files[file_name].insert(name);
  }
  if (files.empty()) throw UserError(fmt::format("{}: weight_map is empty", path));
  return files;
}

}  // namespace

void read_hf_weights(const std::string& dir, const std::function<void(const std::string&, const at::Tensor&)>& take) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw UserError(fmt::format("{}: not a directory (a Hugging Face model directory with config.json and "
                                "model.safetensors is expected)",
                                dir));
  std::map<std::string, std::set<std::string>> files;  // file -> the tensors the index puts there (empty: all)
  if (fs::exists(fs::symlink_status(root / "model.safetensors.index.json", ec))) {
    files = index_files(root);
  } else if (fs::exists(fs::symlink_status(root / "model.safetensors", ec))) {
    files["model.safetensors"] = {};
  } else {
    throw UserError(fmt::format("{}: no model.safetensors or model.safetensors.index.json (Hugging Face weights in "
                                "safetensors format expected)", dir));
  }
  std::map<std::string, std::string> seen;  // tensor -> its file
  for (const auto& [file, listed] : files) {
    const SafetensorsReader reader((root / file).string());
    for (const auto& name : listed)
      if (!reader.contains(name))
        throw UserError(fmt::format("{}: no tensor {}, which {} places in this file", reader.path(), name,
                                    (root / "model.safetensors.index.json").string()));
    for (const auto& name : reader.names()) {
      if (auto [it, fresh] = seen.emplace(name, file); !fresh)
        throw UserError(fmt::format("{}: tensor {} is also in {}; each tensor must be stored once", reader.path(), name,
                                    (root / it->second).string()));
      // Model weights are floating point; an integer tensor of the same width would be taken
      // bit for bit as something else.
      if (!at::isFloatingType(reader.dtype(name)))
        throw UserError(fmt::format("{}: tensor {} is stored as {}; Hugging Face weights must be floating point (F32, "
                                    "BF16, F16 or F64)",
                                    reader.path(), name, safetensors_dtype_name(reader.dtype(name))));
    }
    for (const auto& name : reader.names()) take(name, reader.read(name));
  }
}

}  // namespace trainer::checkpoint
