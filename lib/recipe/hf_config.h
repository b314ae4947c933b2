#pragma once
// model.hf_config: a Hugging Face config.json read into the recipe's model section.
// Supported model types: llama, mistral, mixtral. Mixtral's MoE fields move into model.moe.
// Features the trainer does not implement (biases, other activations, sliding windows, other
// rope scalings) are errors naming the file and the field, never silently dropped.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainer::recipe {

// Reads `path` (a config.json, or a directory holding one) and returns {"model": {...}} in
// recipe form. Problems are appended; a file that cannot be read or parsed throws UserError.
nlohmann::json read_hf_config(const std::string& path, std::vector<std::string>& problems);

}  // namespace trainer::recipe
