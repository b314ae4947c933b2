#pragma once
// Which decoder layers each pipeline stage holds (DESIGN.md invariant 6), decided in one place for
// the runtime (train/pipeline_plan.h) and the estimator (estimate/job_layout.h): the layers split
// over pp * vpp model chunks by layer_split, each chunk placed on its stage by the schedule kind.
// Torch-free.
#include <cstdint>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::parallel {

// One model chunk: decoder layers [first_layer, end_layer).
struct ChunkLayers {
  int64_t chunk = 0;  // in model order
  int64_t first_layer = 0, end_layer = 0;
};

struct PipelineLayout {
  ScheduleSpec spec;  // the recipe's schedule kind, pp, vpp and micro-batches per step
  std::vector<std::vector<ChunkLayers>> stages;  // per stage: its chunks, in increasing model order
  int64_t embedding_stage = 0;  // holds model chunk 0 (the embedding)
  int64_t head_stage = 0;       // holds the last model chunk (final norm, LM head, loss)

  int64_t model_chunks() const { return spec.pp * spec.vpp; }
};

// The layout of the recipe's pipeline at `mesh` (pp = 1: one stage, one chunk, every layer).
// Throws std::invalid_argument when parallel.pipeline_layout does not fit (validation says so
// first); it does not check the schedule's micro-batch rules (check_spec does).
PipelineLayout layout_pipeline(const recipe::Recipe& r, const recipe::MeshShape& mesh);

}  // namespace trainer::parallel
