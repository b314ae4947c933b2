#pragma once
// An element-wise optimizer (update_rule.h: AdamW, 8-bit AdamW, Lion) over whole local parameters,
// as replicated data parallelism runs it: every rank updates the parameters it holds from their
// reduced gradients. When the model trains in bf16 it keeps fp32 master weights: the gradients
// are widened to fp32 slice by slice, the masters are updated, and the model's weights are
// refreshed from them. Norms and biases get no weight decay.
#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/parameter.h"
#include "optim/update_rule.h"
#include "recipe/recipe.h"

namespace trainer::optim {

// One optimizer state tensor for checkpoints: "optimizer.<state>.<parameter>".
struct NamedTensor {
  std::string name;
  at::Tensor tensor;  // the live state: per element in the parameter's local shape; per block flat
  const model::Parameter* parameter = nullptr;
  const PieceGeometry* piece = nullptr;  // per-block state: the piece it belongs to (else null)
};

class LocalOptimizer {
 public:
  // The parameters must outlive the optimizer. fp32 master copies are kept when they are not fp32.
  LocalOptimizer(std::deque<model::Parameter>& params, const recipe::OptimizerConfig& config);

  // One update with the gradients currently in the parameters' .grad or main_grad (already clipped).
  void step(double lr);
  void zero_grad();

  int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(int64_t steps) { steps_taken_ = steps; }
  bool has_master_weights() const { return !masters_.empty(); }
  // At most about this many bytes of fp32 copies (of bf16 gradients, of bf16 moments) exist at once
  // during step(): the update runs in slices of parameters, each closed once its copies reach the
  // budget (so a slice may exceed it by one tensor). Results do not depend on it.
  static constexpr int64_t kCopyBudgetBytes = int64_t(64) << 20;
  void set_copy_budget_bytes(int64_t bytes) { copy_budget_bytes_ = bytes; }
  // 8-bit blocks shared with other ranks (a last dimension of at most 256 columns split by tp): the
  // maximum over them, given the parameters of the block maxima (one per parameter; undefined for
  // parameters without blocks).
  using MaximaReducer = std::function<void(const std::vector<const model::Parameter*>&, std::vector<at::Tensor>&)>;
  void set_maxima_reducer(MaximaReducer reducer) { reduce_maxima_ = std::move(reducer); }
  // Whole-matrix rules (Muon) with matrices split across ranks (tp): given the rule's matrix
  // inputs by parameter index (undefined for the rest), replaces each by its part of the rule's
  // orthogonalize() of the whole matrix, calling `meanwhile` while they travel. Unset: every
  // matrix must be whole here.
  using MatrixAssembler =
      std::function<void(std::vector<at::Tensor>& inputs_by_parameter, const std::function<void()>& meanwhile)>;
  void set_matrix_assembler(MatrixAssembler assembler) { assemble_matrices_ = std::move(assembler); }

  // Optimizer state by name for checkpoints ("optimizer.exp_avg.<param>", ..., "optimizer.master.<param>",
  // and "optimizer.step.<param>"); the tensors are the live state.
  std::vector<NamedTensor> state();
  // Copies the parameters into the fp32 master weights (after the parameters were loaded).
  void refresh_master_weights();
  const UpdateRule& rule() const { return *rule_; }

 private:
  int64_t copy_budget_bytes_ = kCopyBudgetBytes;
  std::deque<model::Parameter>& params_;
  std::unique_ptr<UpdateRule> rule_;
  std::vector<at::Tensor> masters_, steps_;
  std::vector<std::vector<at::Tensor>> states_;
  std::vector<PieceGeometry> geometry_;
  MaximaReducer reduce_maxima_;
  MatrixAssembler assemble_matrices_;
  double weight_decay_;
  int64_t steps_taken_ = 0;
};

}  // namespace trainer::optim
