#pragma once
// Cross-field rules of a recipe (types and ranges are checked against the schema before).
// Each problem names the fields, their values and a valid alternative.
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::recipe {

// Upper bounds of the model's sizes. Each is 8x or more the largest published model's (Llama 3.1
// 405B: hidden 16384, MLP 53248, 126 layers, 128 heads of 128; vocabularies of 256K; DeepSeek-V3's
// 256 experts; contexts of 10M tokens), and together they keep every product of sizes far from
// 64-bit overflow. Beyond them a recipe is a typo or a fuzzer, and accepting it would allocate
// terabytes or loop for hours before failing.
inline constexpr int64_t kMaxVocabSize = int64_t(1) << 24;
inline constexpr int64_t kMaxHiddenSize = int64_t(1) << 17;
inline constexpr int64_t kMaxIntermediateSize = int64_t(1) << 20;
inline constexpr int64_t kMaxHiddenLayers = int64_t(1) << 12;
inline constexpr int64_t kMaxHeads = int64_t(1) << 12;  // query and key/value heads
inline constexpr int64_t kMaxHeadDim = int64_t(1) << 12;
inline constexpr int64_t kMaxPositions = int64_t(1) << 27;  // max_position_embeddings and rope's original
inline constexpr int64_t kMaxExperts = int64_t(1) << 12;
// Parameters: at 16 bytes each (weights, gradients, AdamW's moments and fp32 master weights),
// 2^50 need 18 PB, more memory than 100,000 GPUs of 80 GB hold together.
inline constexpr double kMaxParameters = double(int64_t(1) << 50);

// "model.hidden_size=1099511627776 exceeds the largest size trainer accepts, 131072 ..." when
// `value` is above the bound of `key` (a model size key above, as "model.hidden_size" or
// "model.moe.num_local_experts"); nothing for values within it or keys without a bound.
std::optional<std::string> size_bound_problem(const std::string& key, int64_t value);

// "model.head_dim=7 is odd; rotary position embeddings ..." for an odd head width.
std::optional<std::string> head_dim_problem(int64_t head_dim);

// The model's parameter count from its sizes (embedding, attention, MLP or experts, norms, head),
// in double so that no size overflows it. For bounds; the estimator counts exactly.
double approximate_parameters(const ModelConfig& model);

// The rules that hold at any world size, and with `world_size` also those that depend on it
// (mesh divisibility, batch sizes, micro-batches per pipeline). Settings that are valid but
// probably unintended (a warm-up longer than the run) are appended to `warnings` when given.
std::vector<std::string> validate_recipe(const Recipe& recipe, std::optional<int64_t> world_size,
                                         std::vector<std::string>* warnings = nullptr);

}  // namespace trainer::recipe
