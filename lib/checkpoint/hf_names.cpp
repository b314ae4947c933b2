#include "checkpoint/hf_names.h"

#include <utility>

namespace trainer::checkpoint {

namespace {

// Replaces the first `from` in `name` by `to`; false when `from` is not there.
bool replace(std::string& name, const std::string& from, const std::string& to) {
  const size_t at = name.find(from);
  if (at == std::string::npos) return false;
  name.replace(at, from.size(), to);
  return true;
}

bool ends_with(const std::string& name, const std::string& end) {
  return name.size() >= end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0;
}

// Expert projections: Mixtral's w1 (gate), w3 (up), w2 (down) and Qwen's names for them.
const std::pair<const char*, const char*> kProjections[] = {
    {".w1.weight", ".gate_proj.weight"}, {".w3.weight", ".up_proj.weight"}, {".w2.weight", ".down_proj.weight"}};

}  // namespace

bool mlp_moe_names(const recipe::ModelConfig& model) {
  return model.moe.has_value() && (model.qk_norm || model.mla.has_value());
}

std::string routing_bias_name(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias";
}

std::string hf_name(const std::string& name, const recipe::ModelConfig& model) {
  if (!mlp_moe_names(model)) return name;
  std::string out = name;
  if (!replace(out, ".block_sparse_moe.", ".mlp.")) return name;
  if (out.find(".mlp.experts.") != std::string::npos)
    for (const auto& [ours, theirs] : kProjections)
      if (ends_with(out, ours)) {
        out.replace(out.size() - std::string(ours).size(), std::string(ours).size(), theirs);
        break;
      }
  return out;
}

std::string trainer_name(const std::string& name, const recipe::ModelConfig& model) {
  if (!mlp_moe_names(model)) return name;
  // Only the router and the experts moved; a dense layer's mlp.gate_proj stays.
  std::string out = name;
  if (out.find(".mlp.shared_experts.") != std::string::npos) {
    // the same projection names in both
  } else if (out.find(".mlp.experts.") != std::string::npos) {
    for (const auto& [ours, theirs] : kProjections)
      if (ends_with(out, theirs)) {
        out.replace(out.size() - std::string(theirs).size(), std::string(theirs).size(), ours);
        break;
      }
  } else if (!ends_with(out, ".mlp.gate.weight")) {
    return name;
  }
  replace(out, ".mlp.", ".block_sparse_moe.");
  return out;
}

}  // namespace trainer::checkpoint
