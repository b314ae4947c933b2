#pragma once
// How many decoder layers each model chunk holds (torch-free; the runtime and the estimator use
// it). parallel.pipeline_layout gives them explicitly; otherwise the split balances the work of
// the chunks, counting the LM head and loss of the last chunk as extra layers (their GEMM work
// relative to a layer's: vocab * hidden / a layer's weights), as the vocabulary-parallelism paper
// and Megatron's account_for_loss_in_pipeline_split do, and the multi-token prediction modules
// there (a layer, eh_proj and a head each). The embedding lookup is memory-bound and counted as
// nothing.
#include <cstdint>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::parallel {

// Layers of `layers` over `chunks` contiguous chunks minimising the largest chunk's cost, where a
// chunk costs its layers plus `head_cost` on the last one; among equally good splits the one with
// the smallest spread of costs, the earlier chunks holding the extra layers of an uneven rest.
// Every chunk but the first and the last gets at least one layer.
std::vector<int64_t> balanced_layer_split(int64_t layers, int64_t chunks, double head_cost);

// The recipe's split over pp * vpp chunks: parallel.pipeline_layout, or the balanced one with the
// model's head cost. Throws std::invalid_argument for a layout that does not fit (validation says
// it first).
std::vector<int64_t> layer_split(const recipe::Recipe& r, int64_t chunks);

// The LM head and loss (and the MTP modules) in units of one decoder layer's GEMM work (dense layers).
double head_cost_in_layers(const recipe::ModelConfig& m);

}  // namespace trainer::parallel
