#include "train/training_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

#include <algorithm>

#include "checkpoint/hf_export.h"
#include "checkpoint/hf_names.h"
#include "checkpoint/manifest_check.h"
#include "checkpoint/shard_assignment.h"
#include "core/error.h"
#include "core/plural.h"
#include "engine/replicas.h"

namespace trainer::train {

namespace {
// For the errors about weights of another model: "3 weights ... have (first: a, b, c)".
std::string first_names(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names.begin(), names.begin() + std::min<size_t>(names.size(), 4), ", "));
}
const char* have(const std::vector<std::string>& names) { return names.size() == 1 ? "has" : "have"; }

// Whether a weight of the model lives on another pipeline stage: a layer of the model outside this
// rank's chunks, the embedding without the first chunk, the final norm or head without the last.
// A layer past the model's last is nobody's (another model).
bool on_another_stage(const std::string& name, const model::Transformer& model) {
  bool embedding = false, head = false;
  for (int64_t c = 0; c < model.chunks(); ++c) {
    embedding = embedding || model.chunk_layout(c).embedding;
    head = head || model.chunk_layout(c).head;
  }
  if (name == "model.embed_tokens.weight") return !embedding;
  if (name == "model.norm.weight" || name == "lm_head.weight") return !head;
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return false;
  const int64_t layer = std::atoll(name.c_str() + prefix.size());
  const auto& config = model.options().config;
  // The multi-token prediction modules are on the head's stage.
  if (layer >= config.num_hidden_layers) return layer < config.num_hidden_layers + config.num_nextn_predict_layers && !head;
  for (int64_t c = 0; c < model.chunks(); ++c)
    if (layer >= model.chunk_layout(c).first_layer && layer < model.chunk_layout(c).end_layer) return false;
  return true;
}

bool ends_with(const std::string& name, const std::string& end) {
  return name.size() >= end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0;
}

// A tensor of a multi-token prediction module: model.layers.{L + k - 1}.* for k = 1 .. D.
bool mtp_layer(const std::string& name, const recipe::ModelConfig& config) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return false;
  const int64_t layer = std::atoll(name.c_str() + prefix.size());
  return layer >= config.num_hidden_layers && layer < config.num_hidden_layers + config.num_nextn_predict_layers;
}
}  // namespace

checkpoint::CheckpointContent capture_training_state(const model::Transformer& model,
                                                     std::vector<checkpoint::TensorRecord> optimizer_records,
                                                     int64_t optimizer_steps, const recipe::LoadedRecipe& recipe,
                                                     const Progress& progress, const mesh::ProcessGroups& groups,
                                                     std::optional<std::vector<checkpoint::TensorRecord>> parameter_records) {
  checkpoint::CheckpointContent content;
  content.step = progress.step;
  content.consumed_samples = progress.consumed_samples;
  content.recipe = recipe.resolved;
  if (recipe.mesh)
    content.mesh = {{"world_size", recipe.mesh->world_size}, {"tp", recipe.mesh->tp}, {"cp", recipe.mesh->cp},
                    {"dp", recipe.mesh->dp}, {"pp", recipe.mesh->pp}, {"ep", recipe.mesh->ep},
                    {"zero", recipe.recipe.parallel.zero}};
  std::vector<checkpoint::TensorRecord> records;
  if (parameter_records) records = std::move(*parameter_records);
  const mesh::RankLayout& layout = groups.layout();
  for (const auto& p : model.parameters().all()) {
    if (parameter_records) break;  // the optimizer holds them (ZeRO-3)
    if (p.real_numel() == 0) continue;  // padding rows only (a vocabulary padded past its last id)
    auto record = checkpoint::TensorRecord::slice(p.name, p.real_part(p.tensor.detach()), p.global_shape, p.offsets());
    const engine::ReplicaSet holders = engine::parameter_replicas(layout, groups.global_rank(), p);
    if (holders.ranks.size() > 1) record.replicated = engine::as_replication(holders);
    records.push_back(std::move(record));
  }
  for (auto& r : optimizer_records) records.push_back(std::move(r));
  // The default CPU generator's state (nothing in training draws from it today; kept so that
  // anything that does later resumes exactly).
  auto rng = checkpoint::TensorRecord::whole("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (layout.world_size() > 1) rng.replicated = engine::as_replication(engine::world_replicas(layout, groups.global_rank()));
  records.push_back(std::move(rng));
  content.tensors = checkpoint::records_to_write(std::move(records));
  content.extra = {{"optimizer_steps", optimizer_steps}};
  return content;
}

namespace {
// An expert weight ("model.layers.L.block_sparse_moe.experts.E.") of this model that another ep
// rank holds.
bool on_another_expert_rank(const std::string& name, const model::Transformer& model) {
  const auto& config = model.options().config;
  if (model.options().ep.size == 1 || !config.moe) return false;
  const std::string marker = ".block_sparse_moe.experts.";
  const size_t at = name.find(marker);
  const std::string layers = "model.layers.";
  if (at == std::string::npos || name.rfind(layers, 0) != 0) return false;
  // An expert of a dense layer, or past the last expert, belongs to another model.
  const int64_t layer = std::atoll(name.c_str() + layers.size());
  const int64_t expert = std::atoll(name.c_str() + at + marker.size());
  return layer >= 0 && layer < config.num_hidden_layers + config.num_nextn_predict_layers && config.is_moe_layer(layer) && expert >= 0 &&
         expert < config.moe->num_local_experts;
}
}  // namespace

namespace {
void write_parameter(const ParameterWriter& write, model::Parameter& p, const at::Tensor& real_slice) {
  if (write)
    write(p, real_slice);
  else if (p.real_numel() > 0)
    p.real_part(p.tensor.detach()).copy_(real_slice);
}
}  // namespace

Progress restore_model(const checkpoint::LoadedCheckpoint& loaded, model::Transformer& model,
                       const ParameterWriter& write) {
  at::NoGradGuard no_grad;
  // Weights of the checkpoint that this model has no parameter for: another model (more layers,
  // an untied head, experts); resuming would silently drop them.
  std::vector<std::string> unused;
  for (const auto& [name, record] : loaded.manifest().at("tensors").items())
    if ((name.rfind("model.", 0) == 0 || name == "lm_head.weight") && !model.parameters().find(name) &&
        !on_another_stage(name, model) && !on_another_expert_rank(name, model))
      unused.push_back(name);
  if (!unused.empty())
    throw CheckpointOfAnotherModel(fmt::format("{}: {} of the checkpoint {} no parameter in the recipe's model (first: {})",
                                               loaded.path(), count_of(int64_t(unused.size()), "weight", "weights"),
                                               have(unused), first_names(unused)));
  for (auto& p : model.parameters().all()) {
    if (!loaded.contains(p.name))
      throw CheckpointOfAnotherModel(fmt::format("{}: checkpoint has no tensor {}", loaded.path(), p.name));
    const auto stored = loaded.global_shape(p.name);
    if (stored != p.global_shape)
      throw CheckpointOfAnotherModel(fmt::format("{}: tensor {} has global shape [{}] in the checkpoint but [{}] in this "
                                                 "model",
                                                 loaded.path(), p.name, fmt::join(stored, ", "),
                                                 fmt::join(p.global_shape, ", ")));
    if (p.real_numel() > 0) write_parameter(write, p, loaded.read(p.name, p.offsets(), p.real_sizes()));
  }
  if (loaded.contains("rng.cpu")) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    try {
      generator.set_state(loaded.read("rng.cpu"));
    } catch (const c10::Error& e) {  // a state of another size or dtype: ATen says which
      throw UserError(fmt::format("{}: tensor rng.cpu is not a CPU generator state: {}", loaded.path(),
                                  e.what_without_backtrace()));
    }
  }
  return Progress{loaded.step(), loaded.consumed_samples()};
}

int64_t load_hf_weights(const std::string& dir, model::Transformer& model, const ParameterWriter& write,
                        int64_t* not_in_weights) {
  std::map<std::string, at::Tensor> weights;
  // Hugging Face names of another family (Qwen3-MoE's experts) as trainer's (checkpoint/hf_names.h).
  const auto& config = model.options().config;
  checkpoint::read_hf_weights(
      dir, [&](const std::string& name, const at::Tensor& t) { weights[checkpoint::trainer_name(name, config)] = t; });
  at::NoGradGuard no_grad;
  // DeepSeek-V3's routing biases (e_score_correction_bias) are the model's routing bias table.
  if (config.moe && checkpoint::mlp_moe_names(config))
    for (const int64_t layer : config.routed_layers()) {
      const auto it = weights.find(checkpoint::routing_bias_name(layer));
      if (it == weights.end()) continue;  // zeros, as transformers initialises them
      model::RoutingBias* bias = model.routing_bias();
      const at::Tensor value = it->second.to(at::kFloat);
      if (!bias) {
        if (value.count_nonzero().item<int64_t>() != 0)
          throw UserError(fmt::format("{}: {} is not zero, but the recipe's model keeps no routing bias; set "
                                      "model.moe.scoring_func=\"sigmoid\" (DeepSeek-V3) or bias_update_rate > 0",
                                      dir, it->first));
      } else {
        at::Tensor row = bias->row(layer);
        if (value.sizes() != row.sizes())
          throw UserError(fmt::format("{}: {} has shape [{}] but the recipe's model has {} experts", dir, it->first,
                                      fmt::join(value.sizes().vec(), ", "), row.size(0)));
        row.copy_(value);
      }
      weights.erase(it);
    }
  int64_t count = 0;
  // Tensors the model has no parameter for mean another model (more layers, untied head, ...):
  // loading the rest would silently train something else. Old exports carry rotary buffers.
  std::vector<std::string> unused;
  for (const auto& [name, tensor] : weights) {
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;
    // DeepSeek's MTP modules carry copies of the shared embedding and head: trainer shares them.
    if (mtp_layer(name, config) && (ends_with(name, ".embed_tokens.weight") || ends_with(name, ".shared_head.head.weight")))
      continue;
    // Another rank's pipeline stage or experts hold it: known to the model, not to this rank.
    if (!model.parameters().find(name) && !on_another_stage(name, model) && !on_another_expert_rank(name, model))
      unused.push_back(name);
  }
  if (!unused.empty())
    throw UserError(fmt::format("{}: {} in the Hugging Face weights {} no parameter of the recipe's model "
                                "(first: {}); the weights are of another model: check model.num_hidden_layers, "
                                "tie_word_embeddings and model.moe against the checkpoint's config.json",
                                dir, count_of(int64_t(unused.size()), "tensor", "tensors"), have(unused), first_names(unused)));
  for (auto& p : model.parameters().all()) {
    auto it = weights.find(p.name);
    // transformers saves no multi-token prediction modules: they keep their initial values.
    if (it == weights.end() && mtp_layer(p.name, config)) {
      if (not_in_weights) ++*not_in_weights;
      continue;
    }
    if (it == weights.end()) throw UserError(fmt::format("{}: no tensor {} in the Hugging Face weights", dir, p.name));
    if (it->second.sizes().vec() != p.global_shape)
      throw UserError(fmt::format("{}: {} has shape [{}] but the recipe's model needs [{}]", dir, p.name,
                                  fmt::join(it->second.sizes().vec(), ", "), fmt::join(p.global_shape, ", ")));
    at::Tensor slice = it->second;
    const auto offsets = p.offsets();
    const auto sizes = p.real_sizes();
    for (size_t d = 0; d < offsets.size(); ++d) slice = slice.narrow(int64_t(d), offsets[d], sizes[d]);
    write_parameter(write, p, slice);
    ++count;
  }
  return count;
}

engine::StateReader optimizer_state_reader(const checkpoint::LoadedCheckpoint& loaded) {
  return [&loaded](const std::string& name, const std::vector<int64_t>& offsets,
                   const std::vector<int64_t>& shape) -> std::optional<at::Tensor> {
    if (loaded.contains(name)) return loaded.read(name, offsets, shape);
    // What trainer writes for the state's parameter decides whether the state may be missing (only
    // the master weights of a parameter stored in fp32: it is its own). Any other state the
    // optimizer asks for is needed.
    const std::string parameter = checkpoint::parameter_of_optimizer_state(name);
    if (name.rfind("optimizer.master.", 0) == 0 && loaded.contains(parameter)) {
      const nlohmann::json& m = loaded.manifest();
      const nlohmann::json& record = m.at("tensors").at(parameter);
      const auto dtype = checkpoint::manifest_dtype(record.at("dtype").get<std::string>());
      const nlohmann::json optimizer =
          m.contains("recipe") && m.at("recipe").contains("optimizer") ? m.at("recipe").at("optimizer") : nlohmann::json();
      const auto required = checkpoint::required_optimizer_state(
          parameter, *dtype, record.at("global_shape").get<std::vector<int64_t>>(), optimizer,
          [&loaded](const std::string& tensor) { return loaded.contains(tensor); });
      if (std::find(required.begin(), required.end(), name) == required.end()) return std::nullopt;
    }
    throw UserError(fmt::format("{}: checkpoint has no tensor {}, which resuming needs (every parameter's optimizer state "
                                "and step count, and its fp32 master weights unless it is stored in fp32): the checkpoint "
                                "is incomplete. Resume from another one (checkpoint.resume=PATH), start over "
                                "(checkpoint.resume=none), or keep only its weights (trainer ckpt export {} --hf OUT, then "
                                "model.init_from=OUT)",
                                loaded.path(), name, loaded.path()));
  };
}

}  // namespace trainer::train
