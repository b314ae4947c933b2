#include "parallel/pipeline/pipeline_layout.h"

#include "parallel/pipeline/layer_split.h"

namespace trainer::parallel {

PipelineLayout layout_pipeline(const recipe::Recipe& r, const recipe::MeshShape& mesh) {
  PipelineLayout layout;
  layout.spec.kind = r.parallel.pipeline_schedule;
  layout.spec.pp = mesh.pp;
  layout.spec.vpp = mesh.vpp;
  layout.spec.micro_batches = mesh.grad_accum_steps;
  const int64_t chunks = layout.model_chunks();
  const std::vector<int64_t> split = layer_split(r, chunks);
  layout.stages.resize(size_t(mesh.pp));
  // Chunks in model order, so every stage's list is in increasing model order too.
  for (int64_t c = 0, first = 0; c < chunks; first += split[size_t(c)], ++c) {
    const int64_t stage = place_chunk(layout.spec.kind, mesh.pp, mesh.vpp, c).stage;
    layout.stages[size_t(stage)].push_back(ChunkLayers{c, first, first + split[size_t(c)]});
  }
  layout.embedding_stage = place_chunk(layout.spec.kind, mesh.pp, mesh.vpp, 0).stage;
  layout.head_stage = place_chunk(layout.spec.kind, mesh.pp, mesh.vpp, chunks - 1).stage;
  return layout;
}

}  // namespace trainer::parallel
