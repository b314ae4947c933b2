#pragma once
// ZeRO-1/2/3 (parallel.zero >= 1 over more than one data-parallel rank): the AdamW state sharded
// over the ranks by engine::DistributedOptimizer, ZeRO-2's gradient shards kept by the buckets,
// and ZeRO-3's parameters gathered layer by layer (engine::Zero3Gathers). This adapts them to
// the driver's Optimizer interface and says which stage runs.
#include <memory>

#include "mesh/process_groups.h"
#include "model/transformer.h"
#include "engine/zero/distributed_optimizer.h"
#include "engine/grad_buckets.h"
#include "recipe/recipe.h"
#include "train/optimizer.h"

namespace trainer::train {

class ZeroOptimizer final : public Optimizer {
 public:
  // The buckets must be sharded (BucketOptions::sharded), per unit under ZeRO-3; they, the model
  // and the groups must outlive the optimizer.
  ZeroOptimizer(engine::GradBuckets& buckets, model::Transformer& model, const recipe::Recipe& recipe,
                const mesh::ProcessGroups& groups);

  void step(double lr) override { sharded_.step(lr); }
  int64_t steps_taken() const override { return sharded_.steps_taken(); }
  void refresh_master_weights() override { sharded_.refresh_master_weights(); }
  // This rank's fragments as flat ranges of each parameter's slice, the step counts replicated.
  std::vector<checkpoint::TensorRecord> checkpoint_records() const override { return sharded_.checkpoint_records(); }
  void load_state(const engine::StateReader& read, int64_t steps_taken) override;
  std::string describe(const std::string& buckets, const std::string& dtype) const override;

  void wait_parameter_gathers() override { sharded_.wait_gathers(); }
  double parameter_gather_wait_s() const override { return sharded_.gather_wait_s(); }

  void release_gathered_parameters() override;
  void end_backward(int64_t chunk) override;
  std::optional<std::vector<checkpoint::TensorRecord>> parameter_records() const override;
  std::function<void(model::Parameter&, const at::Tensor&)> parameter_writer() override;

 private:
  const mesh::ProcessGroups& groups_;
  int64_t stage_;  // parallel.zero: 1, 2 or 3
  bool accumulate_unsharded_;
  bool reshard_after_forward_;
  engine::DistributedOptimizer sharded_;
};

}  // namespace trainer::train
