#pragma once
// AdamW through ATen's fused kernel (_fused_adamw_), with fp32 master weights and moments when the
// model trains in bf16: gradients are copied to fp32, the master weights are updated, and the
// model's bf16 weights are refreshed from them. Norms get no weight decay.
#include <ATen/core/Tensor.h>

#include <deque>
#include <string>
#include <vector>

#include "model/parameter.h"
#include "recipe/recipe.h"

namespace trainer::optim {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

class AdamW {
 public:
  // The parameters must outlive the optimizer. fp32 master copies are kept when they are not fp32.
  AdamW(std::deque<model::Parameter>& params, const recipe::OptimizerConfig& config);

  // One update with the gradients currently in the parameters' .grad (already clipped).
  void step(double lr);
  void zero_grad();

  int64_t steps_taken() const { return steps_taken_; }
  bool has_master_weights() const { return !masters_.empty(); }
  // At most about this many bytes of fp32 copies of bf16 gradients exist at once during step():
  // the update runs in slices of parameters, each closed once its copies reach the budget (so a
  // slice may exceed it by one tensor). Results do not depend on it.
  static constexpr int64_t kCopyBudgetBytes = int64_t(64) << 20;
  void set_copy_budget_bytes(int64_t bytes) { copy_budget_bytes_ = bytes; }

  // Optimizer state by name for checkpoints ("optimizer.exp_avg.<param>", "optimizer.exp_avg_sq.<param>",
  // "optimizer.master.<param>", and "optimizer.step.<param>"); the tensors are the live state.
  std::vector<NamedTensor> state();
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  // Copies the parameters into the fp32 master weights (after the parameters were loaded).
  void refresh_master_weights();

 private:
  struct Group {
    double weight_decay = 0;
    std::vector<size_t> members;  // indices into params_
  };
  int64_t copy_budget_bytes_ = kCopyBudgetBytes;
  std::deque<model::Parameter>& params_;
  recipe::OptimizerConfig config_;
  std::vector<at::Tensor> masters_, exp_avgs_, exp_avg_sqs_, state_steps_;
  std::vector<Group> groups_;
  int64_t steps_taken_ = 0;
};

// The L2 norm of all gradients together (fp32), as a scalar tensor. Parameters without a gradient
// count as zero.
at::Tensor global_grad_norm(const std::deque<model::Parameter>& params);

// The factor that brings a gradient norm down to max_norm: 1 when max_norm <= 0 (no clipping) or
// the norm is already below it.
double clip_coefficient(double max_norm, double norm);

// Scales gradients by clip_coefficient(max_norm, norm). Returns the coefficient applied.
double clip_gradients(std::deque<model::Parameter>& params, double max_norm, double norm);

}  // namespace trainer::optim
