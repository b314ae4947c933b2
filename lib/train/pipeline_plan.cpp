#include "train/pipeline_plan.h"

#include <fmt/format.h>

#include <stdexcept>

namespace trainer::train {

int64_t PipelinePlan::local_chunk(int64_t chunk) const {
  for (size_t k = 0; k < model_chunk.size(); ++k)
    if (model_chunk[k] == chunk) return int64_t(k);
  throw std::logic_error(fmt::format("model chunk {} is not on pipeline stage {}", chunk, stage));
}

PipelinePlan plan_pipeline(const parallel::PipelineLayout& layout, int64_t stage) {
  PipelinePlan plan;
  plan.stage = stage;
  plan.spec = layout.spec;
  parallel::check_spec(plan.spec);
  const int64_t chunks = plan.model_chunks();
  for (const parallel::ChunkLayers& c : layout.stages.at(size_t(stage))) {
    plan.model_chunk.push_back(c.chunk);
    plan.chunks.push_back(model::ChunkLayout{c.first_layer, c.end_layer, c.chunk == 0, c.chunk == chunks - 1});
  }
  return plan;
}

engine::PipelineLinks pipeline_links(const parallel::ScheduleSpec& spec, const recipe::Recipe& r,
                                       const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups,
                                       at::TensorOptions options) {
  engine::PipelineLinks links;
  if (mesh.pp == 1) return links;
  links.group = &groups.get(mesh::GroupKind::Pp);
  links.peer = [spec](const parallel::Action& a) { return parallel::peer_stage(spec, a); };
  const int64_t tp = r.parallel.sequence_parallel ? mesh.tp : 1;
  links.shape = {r.training.seq_len / mesh.cp / tp, r.training.micro_batch_size, r.model.hidden_size};
  links.options = options;
  return links;
}

}  // namespace trainer::train
