#include "optim/adamw8bit_rule.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

namespace trainer::optim {

namespace {
// State order of a quantised piece (make_state): codes and maxima of each moment.
enum { kAvgCode, kAvgMax, kSqCode, kSqMax };
// ... and of a piece that keeps fp32 moments.
enum { kAvg, kSq };

// The piece's elements' blocks, counted from the block of its first element.
at::Tensor block_ids(const PieceGeometry& g, const at::TensorOptions& options) {
  const BlockGrid grid = g.grid();
  const at::Tensor index = at::arange(g.offset, g.offset + g.length, options.dtype(at::kLong));
  const at::Tensor rows = index.div(grid.row_length, "floor");
  const at::Tensor columns = index.remainder(grid.row_length);
  return rows.mul(grid.chunks_per_row).add_(columns.div(kQuantBlock, "floor")).sub_(grid.first_block(g.offset));
}

// One moment's update as separate operations: beta * old + (1 - beta) * x.
at::Tensor blend(const at::Tensor& old, double beta, const at::Tensor& x) {
  return at::add(at::mul(old, beta), at::mul(x, 1 - beta));
}
}  // namespace

std::vector<StateSpec> AdamW8bitRule::state_specs(const PieceGeometry& piece) const {
  if (!quantized(piece)) return {{"exp_avg", at::kFloat, false}, {"exp_avg_sq", at::kFloat, false}};
  return {{"exp_avg_code", at::kByte, false},
          {"exp_avg_absmax", at::kFloat, true},
          {"exp_avg_sq_code", at::kByte, false},
          {"exp_avg_sq_absmax", at::kFloat, true}};
}

const QuantizationCode& AdamW8bitRule::code(bool is_signed, const at::Tensor& like) const {
  QuantizationCode& c = is_signed ? signed_ : unsigned_;
  if (!c.values.defined() || c.values.device() != like.device()) c = QuantizationCode::make(is_signed, like.options());
  return c;
}

namespace {
// Whole flat blocks of 256 (rows a multiple of 256 columns, the piece from a block's start to a
// block's end): the piece is then a [blocks, 256] matrix and each block's maximum broadcasts over
// its row, with no per-element block index. The same products and quotients as through the
// index: only cheaper.
bool whole_blocks(const PieceGeometry& g) {
  return g.row_length % kQuantBlock == 0 && g.offset % kQuantBlock == 0 && g.length % kQuantBlock == 0;
}
}  // namespace

AdamW8bitRule::Moments AdamW8bitRule::new_moments(const Piece& piece) const {
  const std::vector<at::Tensor>& s = *piece.state;
  at::Tensor g = piece.grad.to(at::kFloat);
  at::Tensor ids, avg_max, sq_max;
  if (whole_blocks(*piece.geometry)) {
    g = g.view({-1, kQuantBlock});
    avg_max = s[kAvgMax].unsqueeze(1);
    sq_max = s[kSqMax].unsqueeze(1);
  } else {
    ids = block_ids(*piece.geometry, g.options());
    avg_max = s[kAvgMax].index_select(0, ids);
    sq_max = s[kSqMax].index_select(0, ids);
  }
  const at::Tensor m_old = dequantize(code(true, g), s[kAvgCode]).view(g.sizes()).mul_(avg_max);
  const at::Tensor v_old = dequantize(code(false, g), s[kSqCode]).view(g.sizes()).mul_(sq_max);
  return {blend(m_old, config_.beta1(), g), blend(v_old, config_.beta2(), at::mul(g, g)), ids};
}

std::vector<AdamW8bitRule::Run> AdamW8bitRule::runs(const Piece& piece) const {
  const PieceGeometry& g = *piece.geometry;
  const BlockGrid grid = g.grid();
  const int64_t end = g.offset + g.length, first = grid.first_block(g.offset);
  std::vector<Run> out;
  for (int64_t begin = g.offset; begin < end;) {
    // The run ends at the first block boundary at or after begin + run_elements_ (or the piece's end).
    int64_t stop = std::min(end, begin + run_elements_);
    if (stop < end) {
      const int64_t block = grid.block_of(stop);
      stop = std::min(end, grid.block_begin(block) > begin ? grid.block_begin(block) : grid.block_end(block));
    }
    // A piece beginning or ending inside a block: that part block is a run of its own, so that the
    // runs between are whole blocks (whole_blocks).
    const int64_t head_block = grid.block_of(begin);
    if (grid.block_begin(head_block) < begin) stop = std::min(stop, grid.block_end(head_block));
    const int64_t tail_begin = grid.block_begin(grid.block_of(end - 1));
    if (begin < tail_begin && stop > tail_begin && grid.block_end(grid.block_of(end - 1)) != end) stop = tail_begin;
    Run run;
    run.geometry = g;
    run.geometry.offset = begin;
    run.geometry.length = stop - begin;
    run.first_block = grid.first_block(begin) - first;
    run.blocks = grid.blocks_touched(begin, stop - begin);
    const int64_t at = begin - g.offset;
    const std::vector<at::Tensor>& s = *piece.state;
    run.state = {s[kAvgCode].narrow(0, at, run.geometry.length), s[kAvgMax].narrow(0, run.first_block, run.blocks),
                 s[kSqCode].narrow(0, at, run.geometry.length), s[kSqMax].narrow(0, run.first_block, run.blocks)};
    out.push_back(std::move(run));
    begin = stop;
  }
  // Pointers into the runs once the vector no longer moves.
  for (Run& run : out) {
    const int64_t at = run.geometry.offset - g.offset;
    run.piece = {piece.weight.narrow(0, at, run.geometry.length), piece.grad.narrow(0, at, run.geometry.length),
                 piece.step, &run.state, &run.geometry};
  }
  return out;
}

std::vector<at::Tensor> AdamW8bitRule::block_maxima(const std::vector<Piece>& pieces) const {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (const Piece& piece : pieces) {
    if (!quantized(*piece.geometry)) {
      out.emplace_back();
      continue;
    }
    const int64_t blocks = piece.geometry->grid().blocks_touched(piece.geometry->offset, piece.geometry->length);
    at::Tensor maxima = at::zeros({2, blocks}, piece.weight.options());
    for (const Run& run : runs(piece)) {
      const Moments mo = new_moments(run.piece);
      // Runs begin and end at block boundaries inside the piece: no block spans two runs.
      at::Tensor mine = maxima.narrow(1, run.first_block, run.blocks);
      if (mo.block_ids.defined()) {
        mine[0].scatter_reduce_(0, mo.block_ids, mo.m.abs(), "amax");
        mine[1].scatter_reduce_(0, mo.block_ids, mo.v.abs(), "amax");
      } else {
        mine[0].copy_(std::get<0>(mo.m.abs().max(1)));
        mine[1].copy_(std::get<0>(mo.v.abs().max(1)));
      }
    }
    out.push_back(maxima);
  }
  return out;
}

void AdamW8bitRule::update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                           const std::vector<at::Tensor>& maxima) {
  at::NoGradGuard no_grad;
  const double b1 = config_.beta1(), b2 = config_.beta2();
  const double step_size = lr / (1 - std::pow(b1, double(step)));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(b2, double(step)));
  // PyTorch's AdamW: decay, then weight -= step_size * m / (sqrt(v) / sqrt(bc2) + eps).
  const auto apply = [&](const Piece& piece, const at::Tensor& m, const at::Tensor& v) {
    const at::Tensor weight = piece.weight.view(m.sizes());
    if (piece.geometry->decay && weight_decay != 0) weight.mul_(1 - lr * weight_decay);
    const at::Tensor denominator = at::add(at::div(v.sqrt(), bias_correction2_sqrt), config_.eps);
    weight.sub_(at::mul(at::div(m, denominator), step_size));
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    std::vector<at::Tensor>& s = *piece.state;
    piece.step.add_(1.0);
    if (!quantized(*piece.geometry)) {
      const at::Tensor g = piece.grad.to(at::kFloat);
      const at::Tensor m = blend(s[kAvg], b1, g), v = blend(s[kSq], b2, at::mul(g, g));
      apply(piece, m, v);
      s[kAvg].copy_(m);
      s[kSq].copy_(v);
      continue;
    }
    // Quantised by the blocks' maxima over every holder (a block's maximum 0: all its values are 0).
    const at::Tensor& mx = maxima.at(i);
    for (const Run& run : runs(piece)) {
      const Moments mo = new_moments(run.piece);
      apply(run.piece, mo.m, mo.v);
      const at::Tensor run_max = mx.narrow(1, run.first_block, run.blocks);
      for (int row = 0; row < 2; ++row) {
        const at::Tensor block_max = run_max[row];
        const at::Tensor safe = at::where(block_max > 0, block_max, at::ones_like(block_max));
        const at::Tensor divisor = mo.block_ids.defined() ? safe.index_select(0, mo.block_ids) : safe.unsqueeze(1);
        const at::Tensor& moment = row == 0 ? mo.m : mo.v;
        run.state[size_t(row == 0 ? kAvgCode : kSqCode)].copy_(
            quantize(code(row == 0, moment), at::div(moment, divisor)).view({-1}));
      }
    }
    s[kAvgMax].copy_(mx[0]);
    s[kSqMax].copy_(mx[1]);
  }
}

}  // namespace trainer::optim
