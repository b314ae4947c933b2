#include "optim/update_rule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <stdexcept>
#include <string>

#include "optim/adamw8bit_rule.h"
#include "optim/adamw_rule.h"
#include "optim/lion_rule.h"
#include "optim/muon_rule.h"

namespace trainer::optim {

std::vector<at::Tensor> UpdateRule::make_state(const PieceGeometry& piece, const at::TensorOptions& like) const {
  std::vector<at::Tensor> out;
  for (const StateSpec& spec : state_specs(piece)) {
    const int64_t n = spec.per_block ? piece.grid().blocks_touched(piece.offset, piece.length) : piece.length;
    out.push_back(at::zeros({n}, like.dtype(spec.dtype)));
  }
  return out;
}

std::unique_ptr<UpdateRule> make_update_rule(const recipe::OptimizerConfig& config) {
  switch (config.name) {
    case recipe::OptimizerName::AdamW: return std::make_unique<AdamWRule>(config);
    case recipe::OptimizerName::AdamW8bit: return std::make_unique<AdamW8bitRule>(config);
    case recipe::OptimizerName::Lion: return std::make_unique<LionRule>(config);
    case recipe::OptimizerName::Muon: return std::make_unique<MuonRule>(config);
  }
  throw std::logic_error("make_update_rule: unknown optimizer.name");
}

void run_update(UpdateRule& rule, const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                int64_t copy_budget_bytes, const CrossPiece& cross) {
  at::NoGradGuard no_grad;
  // Slices [begin, end) of pieces, each closed once its fp32 copies reach the budget (so a slice
  // may exceed it by one piece).
  std::vector<std::pair<size_t, size_t>> slices;
  int64_t copied = 0;
  size_t begin = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    copied += p.geometry->length *
              ((p.grad.scalar_type() == at::kFloat ? 0 : 4) + rule.widened_state_bytes(*p.geometry));
    if (copied >= copy_budget_bytes) {
      slices.emplace_back(begin, i + 1);
      begin = i + 1;
      copied = 0;
    }
  }
  if (begin < pieces.size()) slices.emplace_back(begin, pieces.size());
  const auto part = [&](const std::pair<size_t, size_t>& s) {
    return std::vector<Piece>(pieces.begin() + long(s.first), pieces.begin() + long(s.second));
  };
  std::vector<at::Tensor> combined;
  if (rule.blockwise()) {
    for (const auto& s : slices)
      for (auto& m : rule.block_maxima(part(s))) combined.push_back(std::move(m));
    if (cross.reduce_maxima) cross.reduce_maxima(combined);
  } else if (rule.whole_matrices()) {
    combined = rule.matrix_inputs(pieces);
    // The pieces updated element-wise take their step while the matrices travel.
    const auto element_wise = [&] {
      for (const auto& s : slices) {
        std::vector<Piece> mine;
        for (size_t i = s.first; i < s.second; ++i)
          if (!pieces[i].geometry->matrix) mine.push_back(pieces[i]);
        if (!mine.empty()) rule.update(mine, lr, weight_decay, step, {});
      }
    };
    if (cross.orthogonalize) {
      cross.orthogonalize(combined, element_wise);
    } else {
      element_wise();
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!combined[i].defined()) continue;
        const PieceGeometry& g = *pieces[i].geometry;
        if (g.offset != 0 || g.length != g.rows * g.cols)
          throw std::logic_error("run_update: " + g.parameter + " is not whole here and no one assembles it");
        combined[i] = rule.orthogonalize(combined[i].view({g.rows, g.cols})).reshape({-1});
      }
    }
    std::vector<Piece> matrices;
    std::vector<at::Tensor> orthogonalized;
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i].geometry->matrix) {
        matrices.push_back(pieces[i]);
        orthogonalized.push_back(std::move(combined[i]));
      }
    if (!matrices.empty()) rule.update(matrices, lr, weight_decay, step, orthogonalized);
    return;
  }
  for (const auto& s : slices) {
    std::vector<at::Tensor> mine;
    if (!combined.empty()) mine.assign(combined.begin() + long(s.first), combined.begin() + long(s.second));
    rule.update(part(s), lr, weight_decay, step, mine);
  }
}

}  // namespace trainer::optim
