#include "train/pipeline_plan.h"

#include "parallel/pipeline/layer_split.h"

#include <fmt/format.h>

#include <stdexcept>

namespace trainer::train {

int64_t PipelinePlan::local_chunk(int64_t chunk) const {
  for (size_t k = 0; k < model_chunk.size(); ++k)
    if (model_chunk[k] == chunk) return int64_t(k);
  throw std::logic_error(fmt::format("model chunk {} is not on pipeline stage {}", chunk, stage));
}

PipelinePlan plan_pipeline(const recipe::Recipe& r, const recipe::MeshShape& mesh, int64_t stage) {
  PipelinePlan plan;
  plan.stage = stage;
  plan.spec.kind = r.parallel.pipeline_schedule;
  plan.spec.pp = mesh.pp;
  plan.spec.vpp = mesh.vpp;
  plan.spec.micro_batches = mesh.grad_accum_steps;
  parallel::check_spec(plan.spec);
  const int64_t chunks = plan.model_chunks();
  const std::vector<int64_t> split = parallel::layer_split(r, chunks);
  // Model order on this stage: every layout places a stage's chunks in increasing model order.
  for (int64_t c = 0, first = 0; c < chunks; first += split[size_t(c)], ++c) {
    if (parallel::place_chunk(plan.spec.kind, mesh.pp, mesh.vpp, c).stage != stage) continue;
    plan.model_chunk.push_back(c);
    plan.chunks.push_back(model::ChunkLayout{first, first + split[size_t(c)], c == 0, c == chunks - 1});
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
