#pragma once
// What this rank runs of the pipeline (DESIGN.md invariant 6): the schedule, its stage, and the
// model chunks it holds (layer ranges; the embedding with the model's first chunk, the final norm,
// LM head and loss with its last). With pp = 1 it is one stage holding the whole model.
#include <cstdint>
#include <vector>

#include "model/transformer.h"
#include "mesh/process_groups.h"
#include "engine/executor.h"
#include "parallel/pipeline/pipeline_layout.h"
#include "parallel/pipeline/schedule.h"
#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::train {

struct PipelinePlan {
  parallel::ScheduleSpec spec;
  int64_t stage = 0;
  std::vector<model::ChunkLayout> chunks;  // this stage's, in model order (local chunk index)
  std::vector<int64_t> model_chunk;        // local chunk -> model chunk

  int64_t model_chunks() const { return spec.pp * spec.vpp; }
  // The local index of a model chunk this stage holds.
  int64_t local_chunk(int64_t chunk) const;
};

// This stage's part of the run's pipeline layout (train/run_plan.h). Throws std::invalid_argument
// when the schedule cannot run that many micro-batches (parallel::check_spec).
PipelinePlan plan_pipeline(const parallel::PipelineLayout& layout, int64_t stage);

// The executor's links to the neighbouring stages for `spec` (none with one stage): [s, b, h]
// activations in the model dtype, the sequence shard of this tp rank under sequence parallelism.
engine::PipelineLinks pipeline_links(const parallel::ScheduleSpec& spec, const recipe::Recipe& r,
                                       const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups,
                                       at::TensorOptions options);

}  // namespace trainer::train
