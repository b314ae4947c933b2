#pragma once
// Where a recipe's model lands on a mesh: which layers each pipeline stage holds, how many
// parameters one rank of that stage keeps (split by tp, ep, etp; embedding on the first stage, LM
// head on the last), and the shapes one rank sees per micro-batch. Torch-free; built on
// count_model (model_counts.h) so the estimator counts exactly what the runtime counts.
#include <cstdint>
#include <vector>

#include "estimate/micro_batch.h"
#include "estimate/model_counts.h"
#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::estimate {

// Parameters (elements) one rank of a stage holds, by how they are replicated: dense parameters
// across dp x cp ranks, expert parameters across the expert-data-parallel ranks (edp).
struct StageParams {
  int64_t dense = 0;
  int64_t expert = 0;
  int64_t norm = 0;      // of the dense ones: norm weights (no weight decay)
  int64_t tables = 0;    // of the dense ones: the embedding and the LM head (and copies of them)
  int64_t tensors = 0;   // parameter tensors (the optimizer keeps a step counter for each)
  int64_t total() const { return dense + expert; }
};

struct StageLayout {
  int64_t stage = 0;
  bool first = false, last = false;          // holds the embedding / the LM head and loss
  std::vector<int64_t> layers;               // global indices of its decoder layers
  int64_t moe_layers = 0;
  StageParams params;
  int64_t largest_layer_params = 0;          // one layer's local parameters
  // ZeRO-3's units on this stage in model order (the embedding, each decoder layer, the final norm
  // and LM head): the local parameters each gathers. An embedding tied to the head on this stage,
  // and with multi-token prediction the LM head and the embedding tables the modules read, are
  // gathered once and kept for the step: counted in pinned_params, not in a unit.
  std::vector<int64_t> unit_params;
  int64_t pinned_params = 0;
};

// How MoE rows are counted: balanced routing (every expert gets its share) or the worst case a
// dropless router allows (every token of the ep group on this rank's experts).
enum class Routing { Balanced, Worst };

struct JobLayout {
  recipe::MeshShape mesh;
  ModelCounts counts;
  std::vector<StageLayout> stages;  // pp entries
  int64_t microbatches = 1;         // per optimizer step per pipeline (grad_accum_steps)
  RankShape shape;                  // one micro-batch on one rank (balanced routing)
  int64_t worst_expert_rows = 0;    // expert_rows under Routing::Worst
};

// Precondition: validate_recipe(recipe, mesh.world_size) reported nothing.
// `counts`: count_model(recipe.model, recipe.training.seq_len) when the caller has it already.
JobLayout layout_job(const recipe::Recipe& recipe, const recipe::MeshShape& mesh, Device device,
                     int64_t cpu_threads = 1, const ModelCounts* counts = nullptr);

}  // namespace trainer::estimate
