#pragma once
// The optimizer as the training loop sees it: the gradient buffers (engine::GradBuckets, fp32
// unless parallel.grad_reduce_dtype says bf16, reduced over each parameter's group), whose norm
// and clipping serve every optimizer, then the Optimizer chosen once at construction: replicated
// AdamW (ZeRO 0, or one data-parallel rank) or ZeRO-1/2/3 (ZeRO-2's buckets keep only their
// reduced gradient shard, ZeRO-3 also gathers the parameters layer by layer).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "mesh/process_groups.h"
#include "model/transformer.h"
#include "engine/grad_buckets.h"
#include "recipe/recipe.h"
#include "train/optimizer.h"

namespace trainer::train {

class OptimizerDriver {
 public:
  OptimizerDriver(model::Transformer& model, const recipe::Recipe& recipe, const mesh::ProcessGroups& groups);

  // Called around each micro-batch's backward of a model chunk and after the last one.
  void begin_step();
  void begin_backward(int64_t chunk, bool last);
  void end_backward(int64_t chunk);
  void finish_gradients();  // waits for the reductions

  // The global gradient norm, every unique element counted once: a 0-dim double tensor on the
  // device (no host synchronisation).
  at::Tensor grad_norm();
  // Scales the gradients so that their norm is at most max_norm (<= 0: no clipping), on the device.
  void clip(double max_norm, const at::Tensor& norm);
  void step(double lr);
  void zero_grad();
  int64_t steps_taken() const;

  // This rank's optimizer state for a checkpoint (no communication): ZeRO-1 fragments as flat
  // ranges, replicated state marked so that one data-parallel rank writes it. Live tensors.
  std::vector<checkpoint::TensorRecord> checkpoint_records() const;
  // After the parameters were set from outside (model.init_from): the fp32 master weights follow.
  void refresh_master_weights();
  // Loads this rank's state (its ZeRO-1 fragments, or all of it) tensor by tensor.
  void load_state(const engine::StateReader& read, int64_t steps_taken);

  // Overlap figures of the gradient reductions (and ZeRO's parameter gathers), when there are any
  // across ranks.
  const engine::OverlapStats* overlap() const;
  // ZeRO: waits for the parameter all-gathers of the last step, which otherwise complete during the
  // next forward. Call before reading parameters outside a forward (checkpoints, exports).
  void wait_parameter_gathers();
  // ZeRO-3: the parameters for a checkpoint, from this rank's shards (capture_training_state);
  // nullopt otherwise (the parameters themselves are saved).
  std::optional<std::vector<checkpoint::TensorRecord>> parameter_records() const;
  // Where loaded parameters go (restore_model, load_hf_weights): ZeRO-3's shards; null otherwise
  // (into the parameters).
  std::function<void(model::Parameter&, const at::Tensor&)> parameter_writer();
  std::string describe() const;

 private:
  model::Transformer& model_;
  const mesh::ProcessGroups& groups_;
  std::unique_ptr<engine::GradBuckets> buckets_;
  std::unique_ptr<Optimizer> optimizer_;  // built after the buckets, whose buffers it updates
  mutable engine::OverlapStats overlap_;
};

}  // namespace trainer::train
