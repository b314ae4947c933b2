#include "train/evaluation.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "engine/executor.h"
#include "train/batch.h"
#include "train/train_step.h"

namespace trainer::train {

EvaluationResult evaluate(const model::Transformer& model, const data::Dataset& held_out, const recipe::Recipe& recipe,
                          const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups,
                          const PipelinePlan& pipeline, c10::Device device) {
  at::NoGradGuard no_grad;
  const auto scalar = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor loss_sum = at::zeros({}, scalar), tokens = at::zeros({}, scalar);
  const int64_t batch = recipe.training.micro_batch_size;
  parallel::ScheduleSpec spec = pipeline.spec;
  spec.kind = parallel::forward_only_for(spec.kind);
  const int64_t last_chunk = pipeline.model_chunks() - 1;
  const engine::PipelineLinks links = pipeline_links(
      spec, recipe, mesh, groups, at::TensorOptions().dtype(model.options().dtype).device(device));
  const std::vector<parallel::Action> actions = parallel::stage_schedule(spec, pipeline.stage);
  for (int64_t k = 0; k < recipe.evaluation.steps; ++k) {
    std::vector<MicroBatch> batches;
    for (int64_t m = 0; m < mesh.grad_accum_steps; ++m) {
      const uint64_t first = first_sample_of(uint64_t(k * mesh.global_batch_size), groups.coordinates().dp,
                                             mesh.grad_accum_steps, m, batch);
      batches.push_back(context_part(
          make_micro_batch(held_out, first, batch, recipe.training.seq_len, device, BatchOptions::of(recipe)),
          mesh.cp, groups.coordinates().cp, recipe.parallel.cp_method == recipe::CpMethod::Ring));
      tokens += (batches.back().targets != model::kIgnoreIndex).sum();
    }
    auto forward = [&](int64_t m, int64_t c, const at::Tensor& input) {
      const MicroBatch& b = batches[size_t(m)];
      model::ForwardOutput out;
      const at::Tensor y = model.forward_chunk(pipeline.local_chunk(c), input, b.inputs, b.targets, &out, b.context);
      if (c == last_chunk) loss_sum += out.loss_sum;
      return y;
    };
    engine::StepExecutor executor(forward, {}, nullptr, pipeline.model_chunks(), links);
    executor.run(actions, /*forward_only=*/true);
  }
  // The loss lives on the stage of the model's last chunk.
  if (mesh.pp > 1) all_reduce_scalars(groups.get(mesh::GroupKind::Pp), {&loss_sum});
  all_reduce_scalars(groups.get(mesh::GroupKind::DpCp), {&loss_sum, &tokens});
  const at::Tensor both = at::stack({loss_sum, tokens}).cpu();
  EvaluationResult result;
  result.tokens = int64_t(both[1].item<double>());
  result.loss = both[0].item<double>() / double(std::max<int64_t>(1, result.tokens));
  result.perplexity = std::exp(result.loss);
  return result;
}

}  // namespace trainer::train
