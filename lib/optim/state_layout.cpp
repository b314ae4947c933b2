#include "optim/state_layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace trainer::optim {

namespace {
int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (const int64_t d : v) n *= d;
  return n;
}
int64_t blocks_in(int64_t columns) { return (columns + kQuantBlock - 1) / kQuantBlock; }
}  // namespace

PieceGeometry piece_geometry(const model::Parameter& p, int64_t offset, int64_t length) {
  PieceGeometry g;
  g.parameter = p.name;
  g.offset = offset;
  g.length = length;
  g.dims = int64_t(p.global_shape.size());
  g.row_length = p.tensor.dim() > 0 ? p.tensor.size(-1) : 1;
  g.global_numel = product(p.global_shape);
  g.decay = p.weight_decay;
  g.matrix = p.layer_matrix && p.global_shape.size() == 2;
  if (g.matrix) {
    g.rows = p.global_shape[0];
    g.cols = p.global_shape[1];
  }
  return g;
}

void check_block_split(const model::Parameter& p) {
  if (p.global_shape.size() < 2) return;
  const int64_t global = p.global_shape.back(), local = p.tensor.size(-1);
  if (local == global || local % kQuantBlock == 0 || global <= kQuantBlock) return;
  throw UserError(fmt::format(
      "optimizer.name=adamw8bit: {} has {} columns split across ranks into slices of {}, which cut its 8-bit blocks "
      "of 256 columns; use a tensor-parallel size that leaves a multiple of 256 columns per rank (or at most 256 "
      "columns in all), or optimizer.name=adamw",
      p.name, global, local));
}

BlockSlice block_layout(const model::Parameter& p) {
  BlockSlice s;
  const int64_t local = p.tensor.size(-1), global = p.global_shape.back();
  s.global_shape = p.global_shape;
  s.global_shape.back() = blocks_in(global);
  s.offsets = p.offsets();
  // A split last dimension: at a block boundary (offset / 256), or (at most 256 columns in all) one
  // block per row shared by every slice.
  s.offsets.back() = local == global || global <= kQuantBlock ? 0 : s.offsets.back() / kQuantBlock;
  s.slice_shape = p.real_sizes();
  s.slice_shape.back() = blocks_in(local);
  return s;
}

std::optional<BlockSlice> block_slice(const model::Parameter& p, const PieceGeometry& piece) {
  BlockSlice s = block_layout(p);
  const int64_t local = p.tensor.size(-1), global = p.global_shape.back();
  if (local != global && global <= kQuantBlock && p.offsets().back() != 0) return std::nullopt;
  const BlockGrid grid = piece.grid();
  const int64_t first = grid.first_block(piece.offset);
  int64_t begin = first;
  if (grid.block_begin(begin) < piece.offset) ++begin;  // begun in the piece before: saved there
  const int64_t end = std::min(grid.block_of(piece.offset + piece.length - 1) + 1, product(s.slice_shape));
  if (end <= begin) return std::nullopt;
  s.begin = begin;
  s.count = end - begin;
  s.piece_index = begin - first;
  return s;
}

BlockRange touched_blocks(const model::Parameter& p, const PieceGeometry& piece) {
  const BlockSlice s = block_layout(p);
  const BlockGrid grid = piece.grid();
  const int64_t first = grid.first_block(piece.offset);
  const int64_t end = std::min(grid.block_of(piece.offset + piece.length - 1) + 1, product(s.slice_shape));
  return {first, std::max<int64_t>(0, end - first)};
}

}  // namespace trainer::optim
