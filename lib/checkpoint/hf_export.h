#pragma once
// Hugging Face interchange. Export writes what `transformers` loads with AutoModelForCausalLM:
// config.json (LlamaForCausalLM, or MixtralForCausalLM for MoE models) and the weights as
// safetensors under their Hugging Face names (trainer already uses them), in files of at most
// `max_shard_bytes` with model.safetensors.index.json when there is more than one.
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "recipe/recipe.h"

namespace trainer::checkpoint {

// The config.json of a model. UserError for models transformers' Llama/Mixtral cannot express
// (shared experts, MoE on only some layers, a capacity factor).
nlohmann::json hf_config_json(const recipe::ModelConfig& model, recipe::Precision dtype);

// Writes config.json and the weights of `loaded` (a committed checkpoint) into `out_dir`.
// Returns the number of weight files written. Everything that can be refused (a model transformers
// cannot express, `out_dir` naming something that is not a directory, an unreadable tensor) is a
// UserError before the first byte is written; every file is then written under a temporary name
// and fsynced, and only then are all renamed into place, so an earlier export is never left
// truncated, nor mixed with the files of an export whose writing failed.
int export_hf(const LoadedCheckpoint& loaded, const std::string& out_dir, uint64_t max_shard_bytes = 5ull << 30);

// Reads Hugging Face weights from a directory (model.safetensors, or an index and its shards):
// calls `take(name, tensor)` for every tensor. UserError naming the file (and tensor or field) when
// it is missing or damaged, when the index's weight_map names anything but a file inside `dir`,
// when a tensor is stored twice, or when a tensor is not floating point (F32, BF16, F16, F64).
// Only regular files are read (symbolic links to them are followed, as in the Hugging Face cache).
void read_hf_weights(const std::string& dir, const std::function<void(const std::string&, const at::Tensor&)>& take);

}  // namespace trainer::checkpoint
