#pragma once
// Muon (Keller Jordan's algorithm with Moonlight's scaling, as Megatron offers it) for the layers'
// weight matrices (PieceGeometry::matrix), AdamW with the same lr and betas for everything else
// (embeddings, the LM head, norms, biases, routers).
//
// Per matrix: the momentum m = mu x m + (1 - mu) x g (optimizer.muon.momentum; the state
// "momentum" in optimizer.state_dtype), the input O = (1 - mu) x g + mu x m with Nesterov or m
// without, orthogonalised on the whole matrix by optimizer.muon.ns_steps Newton-Schulz iterations
// in fp32 (orthogonalize(): X / |X|_F, then X = a X + (b A + c A^2) X with A = X X^T, on the wide
// orientation, coefficients (3.4445, -4.7750, 2.0315)), then the decoupled weight decay
// w = w x (1 - lr x wd) and w = w - lr x scale x O, scale 0.2 x sqrt(max(rows, cols))
// (match_adamw_rms: an update RMS like AdamW's, so AdamW's lr and weight decay carry over) or
// sqrt(max(1, rows / cols)) (spectral). Moonlight's momentum (m = mu m + g, input g + mu m) is
// this one times 1 / (1 - mu): the same after the normalisation.
#include "optim/adamw_rule.h"
#include "optim/update_rule.h"

namespace trainer::optim {

// The Newton-Schulz orthogonalisation of a rows x cols fp32 matrix (a new tensor of its shape).
at::Tensor newton_schulz(const at::Tensor& matrix, int64_t steps);

// The factor of the orthogonalised update of a rows x cols matrix.
double muon_scale(int64_t rows, int64_t cols, recipe::MuonScale scale);

class MuonRule final : public UpdateRule {
 public:
  explicit MuonRule(const recipe::OptimizerConfig& config) : config_(config), adamw_(config) {}
  std::vector<StateSpec> state_specs(const PieceGeometry& piece) const override;
  bool whole_matrices() const override { return true; }
  std::vector<at::Tensor> matrix_inputs(const std::vector<Piece>& pieces) override;
  at::Tensor orthogonalize(const at::Tensor& matrix) const override;
  void update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
              const std::vector<at::Tensor>& combined) override;
  int64_t widened_state_bytes(const PieceGeometry& piece) const override {
    return piece.matrix ? 0 : adamw_.widened_state_bytes(piece);
  }
  std::string describe() const override;

 private:
  recipe::OptimizerConfig config_;
  AdamWRule adamw_;
};

}  // namespace trainer::optim
