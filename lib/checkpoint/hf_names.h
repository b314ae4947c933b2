#pragma once
// Tensor names in Hugging Face files where a family's differ from trainer's own, which are
// Llama's and, for experts, Mixtral's. Qwen3-MoE (a model with q/k norms and experts:
// model.qk_norm with model.moe) and DeepSeek-V3 (model.mla with model.moe) call the MoE block
// `mlp` and its experts' projections gate_proj / up_proj / down_proj, where trainer says
// block_sparse_moe and w1 / w3 / w2 (shared experts keep gate_proj / up_proj / down_proj in both).
// Import (model.init_from) and export (ckpt export --hf) translate; checkpoints keep trainer's names.
#include <string>

#include "recipe/recipe.h"

namespace trainer::checkpoint {

// Whether `model` is exported as, and imported from, Qwen3-MoE or DeepSeek-V3 (the `mlp` names).
bool mlp_moe_names(const recipe::ModelConfig& model);

// DeepSeek-V3's routing bias of MoE layer `layer` in Hugging Face files (the router's
// e_score_correction_bias buffer); trainer keeps it as the routing bias (model/routing_bias.h).
std::string routing_bias_name(int64_t layer);

// The Hugging Face name of trainer's tensor `name` (unchanged for every other family and tensor).
std::string hf_name(const std::string& name, const recipe::ModelConfig& model);

// Trainer's name of the Hugging Face tensor `name` (hf_name's inverse).
std::string trainer_name(const std::string& name, const recipe::ModelConfig& model);

}  // namespace trainer::checkpoint
