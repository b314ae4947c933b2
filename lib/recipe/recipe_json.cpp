#include "recipe/recipe_json.h"

#include <fmt/format.h>

#include <algorithm>

#include "recipe/keys.h"
#include "recipe/validate.h"

namespace trainer::recipe {

namespace {

using nlohmann::json;

const json& at(const json& doc, const std::string& path) {
  static const json null_value;
  const json* node = get_path(doc, path);
  return node ? *node : null_value;
}

template <typename T>
T get(const json& doc, const std::string& path) {
  return at(doc, path).get<T>();
}

template <typename T>
std::optional<T> get_optional(const json& doc, const std::string& path) {
  const json& value = at(doc, path);
  if (value.is_null()) return std::nullopt;
  return value.get<T>();
}

// Integers may arrive as integral floats ("--set training.steps=1e3").
int64_t get_int(const json& doc, const std::string& path) {
  const json& value = at(doc, path);
  return value.is_number_integer() ? value.get<int64_t>() : static_cast<int64_t>(value.get<double>());
}

std::optional<int64_t> get_optional_int(const json& doc, const std::string& path) {
  if (at(doc, path).is_null()) return std::nullopt;
  return get_int(doc, path);
}

template <typename T>
json optional_json(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

}  // namespace

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (!moe) return false;
  for (auto l : moe->layers)
    if (l == layer) return true;
  return false;
}

Recipe recipe_from_json(const json& d, std::vector<std::string>& problems) {
  Recipe r;
  auto& m = r.model;
  m.hf_config = get_optional<std::string>(d, "model.hf_config");
  m.init_from = get_optional<std::string>(d, "model.init_from");
  m.vocab_size = get_int(d, "model.vocab_size");
  m.hidden_size = get_int(d, "model.hidden_size");
  m.intermediate_size = get_int(d, "model.intermediate_size");
  m.num_hidden_layers = get_int(d, "model.num_hidden_layers");
  m.num_attention_heads = get_int(d, "model.num_attention_heads");
  m.num_key_value_heads = get_optional_int(d, "model.num_key_value_heads").value_or(m.num_attention_heads);
  if (auto head_dim = get_optional_int(d, "model.head_dim")) {
    m.head_dim = *head_dim;
  } else if (m.hidden_size % m.num_attention_heads != 0) {
    problems.push_back(fmt::format(
        "model.hidden_size={} is not divisible by model.num_attention_heads={}; set model.head_dim explicitly",
        m.hidden_size, m.num_attention_heads));
    m.head_dim = 1;
  } else {
    m.head_dim = m.hidden_size / m.num_attention_heads;
  }
  m.rope_theta = get<double>(d, "model.rope_theta");
  if (!at(d, "model.rope_scaling").is_null()) {
    RopeScaling s;
    s.rope_type = get<std::string>(d, "model.rope_scaling.rope_type");
    s.factor = get<double>(d, "model.rope_scaling.factor");
    s.low_freq_factor = get<double>(d, "model.rope_scaling.low_freq_factor");
    s.high_freq_factor = get<double>(d, "model.rope_scaling.high_freq_factor");
    s.original_max_position_embeddings = get_int(d, "model.rope_scaling.original_max_position_embeddings");
    m.rope_scaling = s;
  }
  m.rms_norm_eps = get<double>(d, "model.rms_norm_eps");
  m.tie_word_embeddings = get<bool>(d, "model.tie_word_embeddings");
  m.make_vocab_size_divisible_by = get_int(d, "model.make_vocab_size_divisible_by");
  m.max_position_embeddings = get_int(d, "model.max_position_embeddings");
  m.initializer_range = get<double>(d, "model.initializer_range");
  if (!at(d, "model.moe").is_null()) {
    MoeConfig e;
    e.num_local_experts = get_int(d, "model.moe.num_local_experts");
    e.num_experts_per_tok = get_int(d, "model.moe.num_experts_per_tok");
    e.moe_intermediate_size = get_optional_int(d, "model.moe.moe_intermediate_size").value_or(m.intermediate_size);
    e.num_shared_experts = get_int(d, "model.moe.num_shared_experts");
    e.router_aux_loss_coef = get<double>(d, "model.moe.router_aux_loss_coef");
    e.router_z_loss_coef = get<double>(d, "model.moe.router_z_loss_coef");
    e.scoring_func = get<std::string>(d, "model.moe.scoring_func");
    e.n_group = get_int(d, "model.moe.n_group");
    e.topk_group = get_optional_int(d, "model.moe.topk_group").value_or(e.n_group);
    e.norm_topk_prob = get<bool>(d, "model.moe.norm_topk_prob");
    e.routed_scaling_factor = get<double>(d, "model.moe.routed_scaling_factor");
    e.bias_update_rate = get<double>(d, "model.moe.bias_update_rate");
    e.aux_loss_scope = get<std::string>(d, "model.moe.aux_loss_scope");
    e.capacity_factor = get_optional<double>(d, "model.moe.capacity_factor");
    if (at(d, "model.moe.layers").is_null()) {
      // Bounded: validate_recipe refuses more layers than kMaxHiddenLayers, and a fuzzed 1e9
      // must not allocate 8 GB of layer numbers first.
      for (int64_t l = 0; l < std::min(m.num_hidden_layers, kMaxHiddenLayers + 1); ++l) e.layers.push_back(l);
    } else {
      for (const auto& l : at(d, "model.moe.layers"))
        e.layers.push_back(l.is_number_integer() ? l.get<int64_t>() : static_cast<int64_t>(l.get<double>()));
    }
    m.moe = e;
  }

  auto& p = r.parallel;
  p.tp = get_int(d, "parallel.tp");
  p.pp = get_int(d, "parallel.pp");
  p.vpp = get_int(d, "parallel.vpp");
  p.cp = get_int(d, "parallel.cp");
  p.ep = get_int(d, "parallel.ep");
  p.etp = get_optional_int(d, "parallel.etp").value_or(p.tp);
  p.dp = get_int(d, "parallel.dp");
  p.sequence_parallel = get<bool>(d, "parallel.sequence_parallel");
  p.zero = get_int(d, "parallel.zero");
  p.pipeline_schedule = get<std::string>(d, "parallel.pipeline_schedule");
  if (!at(d, "parallel.pipeline_layout").is_null())
    for (const auto& l : at(d, "parallel.pipeline_layout"))
      p.pipeline_layout.push_back(l.is_number_integer() ? l.get<int64_t>() : static_cast<int64_t>(l.get<double>()));
  p.cp_method = get<std::string>(d, "parallel.cp_method");
  p.grad_bucket_mb = get<double>(d, "parallel.grad_bucket_mb");
  p.overlap_grad_reduce = get<bool>(d, "parallel.overlap_grad_reduce");
  p.zero_accumulate_unsharded = get_optional<bool>(d, "parallel.zero_accumulate_unsharded");
  p.zero3_reshard_after_forward = get_optional<bool>(d, "parallel.zero3_reshard_after_forward");
  p.dp_shard = get_int(d, "parallel.dp_shard");
  p.overlap_param_gather = get<bool>(d, "parallel.overlap_param_gather");
  p.grad_reduce_dtype = get<std::string>(d, "parallel.grad_reduce_dtype");
  p.collective_timeout_s = get<double>(d, "parallel.collective_timeout_s");
  p.backend = get<std::string>(d, "parallel.backend");

  auto& t = r.training;
  t.seq_len = get_int(d, "training.seq_len");
  t.micro_batch_size = get_int(d, "training.micro_batch_size");
  t.global_batch_size = get_optional_int(d, "training.global_batch_size");
  t.steps = get_int(d, "training.steps");
  t.seed = get_int(d, "training.seed");
  t.dtype = get<std::string>(d, "training.dtype");
  t.recompute = get<std::string>(d, "training.recompute");
  t.grad_clip = get<double>(d, "training.grad_clip");
  t.fused_kernels = at(d, "training.fused_kernels").get<std::vector<std::string>>();

  auto& o = r.optimizer;
  o.name = get<std::string>(d, "optimizer.name");
  o.lr = get<double>(d, "optimizer.lr");
  o.min_lr = get<double>(d, "optimizer.min_lr");
  o.warmup_steps = get_int(d, "optimizer.warmup_steps");
  o.decay = get<std::string>(d, "optimizer.decay");
  o.beta1 = at(d, "optimizer.betas")[0].get<double>();
  o.beta2 = at(d, "optimizer.betas")[1].get<double>();
  o.eps = get<double>(d, "optimizer.eps");
  o.weight_decay = get<double>(d, "optimizer.weight_decay");

  auto& data = r.data;
  data.source = get<std::string>(d, "data.source");
  data.paths = get<std::vector<std::string>>(d, "data.paths");
  data.format = get<std::string>(d, "data.format");
  if (!at(d, "data.weights").is_null()) data.weights = get<std::vector<double>>(d, "data.weights");
  data.loss_mask_token = get_optional_int(d, "data.loss_mask_token");

  auto& eval = r.evaluation;
  eval.interval = get_int(d, "evaluation.interval");
  eval.steps = get_int(d, "evaluation.steps");
  eval.paths = get<std::vector<std::string>>(d, "evaluation.paths");

  auto& c = r.checkpoint;
  c.dir = get_optional<std::string>(d, "checkpoint.dir");
  c.interval = get_int(d, "checkpoint.interval");
  c.async = get<bool>(d, "checkpoint.async");
  c.keep = get_int(d, "checkpoint.keep");
  c.resume = get<std::string>(d, "checkpoint.resume");

  r.logging.interval = get_int(d, "logging.interval");
  r.logging.metrics_file = get_optional<std::string>(d, "logging.metrics_file");
  r.logging.tensorboard_dir = get_optional<std::string>(d, "logging.tensorboard_dir");
  if (!at(d, "profiling.steps").is_null())
    for (const auto& s : at(d, "profiling.steps"))
      r.profiling.steps.push_back(s.is_number_integer() ? s.get<int64_t>() : static_cast<int64_t>(s.get<double>()));
  r.profiling.dir = get_optional<std::string>(d, "profiling.dir");
  r.hardware.gpu = get<std::string>(d, "hardware.gpu");
  r.hardware.gpus_per_node = get_int(d, "hardware.gpus_per_node");
  return r;
}

json recipe_to_json(const Recipe& r) {
  const auto& m = r.model;
  json model = {
      {"hf_config", optional_json(m.hf_config)},
      {"init_from", optional_json(m.init_from)},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.intermediate_size},
      {"num_hidden_layers", m.num_hidden_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_key_value_heads},
      {"head_dim", m.head_dim},
      {"rope_theta", m.rope_theta},
      {"rope_scaling", nullptr},
      {"rms_norm_eps", m.rms_norm_eps},
      {"tie_word_embeddings", m.tie_word_embeddings},
      {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
      {"max_position_embeddings", m.max_position_embeddings},
      {"initializer_range", m.initializer_range},
      {"moe", nullptr},
  };
  if (m.rope_scaling) {
    const auto& s = *m.rope_scaling;
    model["rope_scaling"] = {{"rope_type", s.rope_type},
                             {"factor", s.factor},
                             {"low_freq_factor", s.low_freq_factor},
                             {"high_freq_factor", s.high_freq_factor},
                             {"original_max_position_embeddings", s.original_max_position_embeddings}};
  }
  if (m.moe) {
    const auto& e = *m.moe;
    const bool all_layers = static_cast<int64_t>(e.layers.size()) == m.num_hidden_layers;
    model["moe"] = {{"num_local_experts", e.num_local_experts},
                    {"num_experts_per_tok", e.num_experts_per_tok},
                    {"moe_intermediate_size", e.moe_intermediate_size},
                    {"num_shared_experts", e.num_shared_experts},
                    {"router_aux_loss_coef", e.router_aux_loss_coef},
                    {"router_z_loss_coef", e.router_z_loss_coef},
                    {"scoring_func", e.scoring_func},
                    {"n_group", e.n_group},
                    {"topk_group", e.topk_group},
                    {"norm_topk_prob", e.norm_topk_prob},
                    {"routed_scaling_factor", e.routed_scaling_factor},
                    {"bias_update_rate", e.bias_update_rate},
                    {"aux_loss_scope", e.aux_loss_scope},
                    {"capacity_factor", optional_json(e.capacity_factor)},
                    {"layers", all_layers ? json(nullptr) : json(e.layers)}};
  }
  const auto& p = r.parallel;
  const auto& t = r.training;
  const auto& o = r.optimizer;
  const auto& c = r.checkpoint;
  return {
      {"model", model},
      {"parallel",
       {{"tp", p.tp}, {"pp", p.pp}, {"vpp", p.vpp}, {"cp", p.cp}, {"ep", p.ep}, {"etp", p.etp}, {"dp", p.dp},
        {"sequence_parallel", p.sequence_parallel}, {"zero", p.zero}, {"pipeline_schedule", p.pipeline_schedule},
        {"pipeline_layout", p.pipeline_layout.empty() ? json(nullptr) : json(p.pipeline_layout)},
        {"cp_method", p.cp_method}, {"grad_bucket_mb", p.grad_bucket_mb},
        {"overlap_grad_reduce", p.overlap_grad_reduce}, {"zero_accumulate_unsharded", optional_json(p.zero_accumulate_unsharded)}, {"zero3_reshard_after_forward", optional_json(p.zero3_reshard_after_forward)}, {"dp_shard", p.dp_shard}, {"overlap_param_gather", p.overlap_param_gather}, {"grad_reduce_dtype", p.grad_reduce_dtype},
        {"collective_timeout_s", p.collective_timeout_s}, {"backend", p.backend}}},
      {"training",
       {{"seq_len", t.seq_len}, {"micro_batch_size", t.micro_batch_size},
        {"global_batch_size", optional_json(t.global_batch_size)}, {"steps", t.steps}, {"seed", t.seed},
        {"dtype", t.dtype}, {"recompute", t.recompute}, {"grad_clip", t.grad_clip},
        {"fused_kernels", t.fused_kernels}}},
      {"optimizer",
       {{"name", o.name}, {"lr", o.lr}, {"min_lr", o.min_lr}, {"warmup_steps", o.warmup_steps}, {"decay", o.decay},
        {"betas", {o.beta1, o.beta2}}, {"eps", o.eps}, {"weight_decay", o.weight_decay}}},
      {"data",
       {{"source", r.data.source}, {"paths", r.data.paths}, {"format", r.data.format},
        {"weights", r.data.weights.empty() ? json(nullptr) : json(r.data.weights)},
        {"loss_mask_token", optional_json(r.data.loss_mask_token)}}},
      {"evaluation",
       {{"interval", r.evaluation.interval}, {"steps", r.evaluation.steps}, {"paths", r.evaluation.paths}}},
      {"checkpoint",
       {{"dir", optional_json(c.dir)}, {"interval", c.interval}, {"async", c.async}, {"keep", c.keep},
        {"resume", c.resume}}},
      {"logging", {{"interval", r.logging.interval}, {"metrics_file", optional_json(r.logging.metrics_file)}, {"tensorboard_dir", optional_json(r.logging.tensorboard_dir)}}},
      {"profiling", {{"steps", r.profiling.steps.empty() ? nlohmann::json() : nlohmann::json(r.profiling.steps)},
                     {"dir", optional_json(r.profiling.dir)}}},
      {"hardware", {{"gpu", r.hardware.gpu}, {"gpus_per_node", r.hardware.gpus_per_node}}},
  };
}

}  // namespace trainer::recipe
