#pragma once
// The replicated optimizer (ZeRO 0, or a single data-parallel rank): every rank holds the whole
// state of its parameters and takes the same update from the all-reduced gradients
// (optim::LocalOptimizer with the recipe's rule).
#include <memory>

#include "engine/whole_matrices.h"
#include "mesh/process_groups.h"
#include "optim/local_optimizer.h"
#include "train/optimizer.h"

namespace trainer::train {

class ReplicatedOptimizer final : public Optimizer {
 public:
  // The parameter set and the groups must outlive the optimizer.
  ReplicatedOptimizer(model::ParameterSet& params, const recipe::OptimizerConfig& config,
                      const mesh::ProcessGroups& groups);

  void step(double lr) override { optimizer_.step(lr); }
  int64_t steps_taken() const override { return optimizer_.steps_taken(); }
  void refresh_master_weights() override { optimizer_.refresh_master_weights(); }
  // Each state tensor as its parameter's slice (padding rows left out), marked replicated over
  // the ranks holding the same slice (a step count: over the ranks holding the parameter).
  std::vector<checkpoint::TensorRecord> checkpoint_records() const override;
  // Missing fp32 master weights (a checkpoint of an fp32 run) are taken from the parameters.
  void load_state(const engine::StateReader& read, int64_t steps_taken) override;
  std::string describe(const std::string& buckets, const std::string& dtype) const override;

 private:
  model::ParameterSet& params_;
  const mesh::ProcessGroups& groups_;
  // mutable: optim::LocalOptimizer::state() hands out the live tensors, which checkpoint_records() only reads.
  mutable optim::LocalOptimizer optimizer_;
  std::unique_ptr<engine::WholeMatrices> whole_matrices_;  // Muon: matrices split by tp
};

}  // namespace trainer::train
