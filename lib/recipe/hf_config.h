#pragma once
// model.hf_config: a Hugging Face config.json read into the recipe's model section.
// Supported model types: llama, mistral, mixtral, qwen2, qwen3. Mixtral's MoE fields move into
// model.moe; sliding windows into model.sliding_window(_layers) as transformers applies them.
// RoPE is read in both layouts: transformers 5's rope_parameters {rope_type, rope_theta, ...} and
// the older top-level rope_theta + rope_scaling; both resolve to the same model.rope_theta and
// model.rope_scaling. Features the trainer does not implement and that change the arithmetic
// (o_proj and MLP biases, other activations, other rope types, dropout, router noise) are errors
// naming the file and the key, never silently dropped; keys neither read nor known to be harmless
// are listed in one warning.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainer::recipe {

// Reads `path` (a config.json, or a directory holding one) and returns {"model": {...}} in
// recipe form. Problems are appended, and so is the warning about unknown keys when `warnings` is
// given; a file that cannot be read or parsed throws UserError.
nlohmann::json read_hf_config(const std::string& path, std::vector<std::string>& problems,
                              std::vector<std::string>* warnings = nullptr);

}  // namespace trainer::recipe
