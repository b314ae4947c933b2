#include "train/zero_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

namespace trainer::train {

namespace {

// ZeRO-3's options from the recipe, or none below stage 3.
std::optional<engine::Zero3Options> zero3_options(const recipe::Recipe& recipe, const model::Transformer& model) {
  if (recipe.parallel.zero < 3) return std::nullopt;
  engine::Zero3Options zero3;
  zero3.reshard_after_forward = recipe.parallel.reshard_after_forward();
  // Under pipeline parallelism a stage's parameters stay gathered for all of its micro-batches
  // (torchtitan's default; the gradients are then reduced once, after the last one).
  zero3.reshard_after_backward = recipe.parallel.pp == 1;
  zero3.head_unit = model.head_unit();
  zero3.keep_head = recipe::splits_backward(recipe.parallel.pipeline_schedule);
  return zero3;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(engine::GradBuckets& buckets, model::Transformer& model, const recipe::Recipe& recipe,
                             const mesh::ProcessGroups& groups)
    : groups_(groups),
      stage_(recipe.parallel.zero),
      accumulate_unsharded_(recipe.parallel.accumulate_unsharded()),
      reshard_after_forward_(recipe.parallel.reshard_after_forward()),
      sharded_(buckets, model.parameters(), recipe.optimizer, recipe.parallel.overlap_param_gather,
               zero3_options(recipe, model)) {}

void ZeroOptimizer::load_state(const engine::StateReader& read, int64_t steps_taken) {
  at::NoGradGuard no_grad;
  sharded_.load_state(read);
  sharded_.set_steps_taken(steps_taken);
}

void ZeroOptimizer::release_gathered_parameters() {
  if (engine::Zero3Gathers* gathers = sharded_.zero3_gathers()) gathers->release_all();
}

void ZeroOptimizer::end_backward(int64_t chunk) {
  if (engine::Zero3Gathers* gathers = sharded_.zero3_gathers()) gathers->end_backward(chunk);
}

std::optional<std::vector<checkpoint::TensorRecord>> ZeroOptimizer::parameter_records() const {
  if (!sharded_.zero3_gathers()) return std::nullopt;
  return sharded_.parameter_records();
}

std::function<void(model::Parameter&, const at::Tensor&)> ZeroOptimizer::parameter_writer() {
  if (!sharded_.zero3_gathers()) return nullptr;
  return [this](model::Parameter& p, const at::Tensor& slice) { sharded_.load_parameter(p, slice); };
}

std::string ZeroOptimizer::describe(const std::string& buckets, const std::string& dtype) const {
  const int64_t ranks = groups_.get(mesh::GroupKind::DpCp).size();
  const int64_t replicas = groups_.get(mesh::GroupKind::DpCpReplicate).size();
  const std::string over = replicas > 1 ? fmt::format("{} x {} data-parallel ranks (hybrid: sharded over {}, "
                                                      "replicated {} times)",
                                                      ranks / replicas, replicas, ranks / replicas, replicas)
                                        : fmt::format("{} data-parallel ranks", ranks);
  const char* reduced = accumulate_unsharded_ ? "once per step" : "every micro-batch";
  // The update rule when it is not plain AdamW ("..., 8-bit AdamW").
  const std::string rule = sharded_.rule().describe();
  const std::string with = rule == "AdamW" ? "" : ", " + rule;
  if (stage_ >= 3)
    return fmt::format("ZeRO-3 over {} (parameters gathered per layer, {}; gradients reduce-scattered {}), {}{}{}", over,
                       sharded_.zero3_gathers() && reshard_after_forward_ ? "released after forward"
                                                                          : "kept from forward to backward",
                       reduced, buckets, dtype, with);
  if (stage_ >= 2)
    return fmt::format("ZeRO-2 over {} (gradients reduce-scattered {}), {}{}{}", over, reduced, buckets, dtype, with);
  return fmt::format("ZeRO-1 over {}, {}{}{}", over, buckets, dtype, with);
}

}  // namespace trainer::train
