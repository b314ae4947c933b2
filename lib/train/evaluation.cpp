#include "train/evaluation.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "train/batch.h"
#include "train/train_step.h"

namespace trainer::train {

EvaluationResult evaluate(const model::Transformer& model, const data::Dataset& held_out, const recipe::Recipe& recipe,
                          const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups, c10::Device device) {
  at::NoGradGuard no_grad;
  const auto scalar = at::TensorOptions().dtype(at::kDouble).device(device);
  at::Tensor loss_sum = at::zeros({}, scalar), tokens = at::zeros({}, scalar);
  const int64_t batch = recipe.training.micro_batch_size;
  for (int64_t k = 0; k < recipe.evaluation.steps; ++k)
    for (int64_t m = 0; m < mesh.grad_accum_steps; ++m) {
      const uint64_t first = first_sample_of(uint64_t(k * mesh.global_batch_size), groups.coordinates().dp,
                                             mesh.grad_accum_steps, m, batch);
      const MicroBatch b =
          make_micro_batch(held_out, first, batch, recipe.training.seq_len, device, recipe.data.loss_mask_token);
      loss_sum += model.forward(b.inputs, b.targets).loss_sum;
      tokens += (b.targets != model::kIgnoreIndex).sum();
    }
  all_reduce_scalars(groups.get(mesh::GroupKind::DpCp), {&loss_sum, &tokens});
  const at::Tensor both = at::stack({loss_sum, tokens}).cpu();
  EvaluationResult result;
  result.tokens = int64_t(both[1].item<double>());
  result.loss = both[0].item<double>() / double(std::max<int64_t>(1, result.tokens));
  result.perplexity = std::exp(result.loss);
  return result;
}

}  // namespace trainer::train
