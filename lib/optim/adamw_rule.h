#pragma once
// AdamW through ATen's fused kernel (_fused_adamw_), PyTorch's formulation (decoupled weight decay,
// bias correction). The moments are fp32, or bf16 (optimizer.state_dtype): then each slice of
// moments is widened to fp32 for the kernel and rounded back to bf16 after it.
#include "optim/update_rule.h"

namespace trainer::optim {

class AdamWRule final : public UpdateRule {
 public:
  explicit AdamWRule(const recipe::OptimizerConfig& config) : config_(config) {}
  std::vector<StateSpec> state_specs(const PieceGeometry& piece) const override;
  void update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
              const std::vector<at::Tensor>& maxima) override;
  std::string describe() const override;
  int64_t widened_state_bytes(const PieceGeometry&) const override {
    return config_.state_dtype == recipe::Precision::BF16 ? 8 : 0;
  }

 private:
  recipe::OptimizerConfig config_;
};

}  // namespace trainer::optim
