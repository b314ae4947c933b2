#include "optim/muon_rule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace trainer::optim {

at::Tensor newton_schulz(const at::Tensor& matrix, int64_t steps) {
  at::NoGradGuard no_grad;
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  // Iterate on the wide orientation: X X^T is then the smaller square.
  const bool tall = matrix.size(0) > matrix.size(1);
  at::Tensor x = (tall ? matrix.t() : matrix).to(at::kFloat);
  x = at::div(x, at::add(at::linalg_vector_norm(x), 1e-7));
  for (int64_t k = 0; k < steps; ++k) {
    const at::Tensor gram = at::mm(x, x.t());
    const at::Tensor poly = at::add(at::mul(gram, b), at::mul(at::mm(gram, gram), c));
    x = at::add(at::mul(x, a), at::mm(poly, x));
  }
  return (tall ? x.t() : x).contiguous();
}

double muon_scale(int64_t rows, int64_t cols, recipe::MuonScale scale) {
  if (scale == recipe::MuonScale::Spectral) return std::sqrt(std::max(1.0, double(rows) / double(cols)));
  return 0.2 * std::sqrt(double(std::max(rows, cols)));
}

std::vector<StateSpec> MuonRule::state_specs(const PieceGeometry& piece) const {
  if (!piece.matrix) return adamw_.state_specs(piece);
  return {{"momentum", config_.state_dtype == recipe::Precision::BF16 ? at::kBFloat16 : at::kFloat, false}};
}

std::vector<at::Tensor> MuonRule::matrix_inputs(const std::vector<Piece>& pieces) {
  at::NoGradGuard no_grad;
  const double mu = config_.muon.momentum;
  std::vector<at::Tensor> out(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    if (!piece.geometry->matrix) continue;
    // Separate element-wise operations (no fused multiply-add), as Lion: an element's momentum
    // does not depend on how the matrix is cut into pieces.
    const at::Tensor g = piece.grad.to(at::kFloat);
    at::Tensor& stored = (*piece.state)[0];
    const at::Tensor m = at::add(at::mul(stored.to(at::kFloat), mu), at::mul(g, 1 - mu));
    stored.copy_(m);
    out[i] = config_.muon.nesterov ? at::add(at::mul(g, 1 - mu), at::mul(m, mu)) : m;
  }
  return out;
}

at::Tensor MuonRule::orthogonalize(const at::Tensor& matrix) const {
  return newton_schulz(matrix, config_.muon.ns_steps);
}

void MuonRule::update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                      const std::vector<at::Tensor>& combined) {
  at::NoGradGuard no_grad;
  std::vector<Piece> others;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    if (!piece.geometry->matrix) {
      others.push_back(piece);
      continue;
    }
    const PieceGeometry& g = *piece.geometry;
    if (i >= combined.size() || !combined[i].defined() || combined[i].numel() != g.length)
      throw std::logic_error("Muon: no orthogonalised update for a piece of " + g.parameter);
    if (g.decay && weight_decay != 0) piece.weight.mul_(1 - lr * weight_decay);
    piece.weight.sub_(at::mul(combined[i], lr * muon_scale(g.rows, g.cols, config_.muon.scale)));
    piece.step.add_(1.0);
  }
  if (!others.empty()) adamw_.update(others, lr, weight_decay, step, {});
}

std::string MuonRule::describe() const {
  return fmt::format("Muon (momentum {}{}, {} Newton-Schulz steps, {} scale{}; AdamW for embeddings, LM head, "
                     "norms, routers)",
                     config_.muon.momentum, config_.muon.nesterov ? " Nesterov" : "", config_.muon.ns_steps,
                     config_.muon.scale == recipe::MuonScale::Spectral ? "spectral" : "match_adamw_rms",
                     config_.state_dtype == recipe::Precision::BF16 ? ", bf16 states" : "");
}

}  // namespace trainer::optim
