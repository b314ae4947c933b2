#pragma once
// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms"): one momentum m; the update
// is sign(beta1 x m + (1 - beta1) x g) times lr, with decoupled weight decay, then
// m = beta2 x m + (1 - beta2) x g. betas are optimizer.betas; the momentum's dtype is
// optimizer.state_dtype. Written as separate element-wise operations (each rounded once, no fused
// multiply-add), so an element's result does not depend on how the parameter is cut into pieces.
#include "optim/update_rule.h"

namespace trainer::optim {

class LionRule final : public UpdateRule {
 public:
  explicit LionRule(const recipe::OptimizerConfig& config) : config_(config) {}
  std::vector<StateSpec> state_specs(const PieceGeometry& piece) const override;
  void update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
              const std::vector<at::Tensor>& maxima) override;
  std::string describe() const override;

 private:
  recipe::OptimizerConfig config_;
};

}  // namespace trainer::optim
