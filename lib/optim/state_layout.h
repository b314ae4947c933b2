#pragma once
// Where an optimizer's state of a piece of a parameter lies in the parameter, for checkpoints:
// per-element state is laid out like the parameter (a flat range of its slice), per-block state
// (8-bit maxima, block_grid.h) like a tensor of the parameter's shape whose last dimension counts
// blocks of 256 columns. Both reshard onto any mesh by the checkpoint's slices.
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "model/parameter.h"
#include "optim/update_rule.h"

namespace trainer::optim {

// The geometry of elements [offset, offset + length) of p's local slice.
PieceGeometry piece_geometry(const model::Parameter& p, int64_t offset, int64_t length);

// Refuses (UserError naming the parameter) block-wise state for a parameter whose last dimension is
// split across ranks at a place that is not a block boundary (a slice width that is not a multiple
// of 256 of a dimension longer than 256): its blocks would straddle ranks in a way the block
// maxima do not combine.
void check_block_split(const model::Parameter& p);

// The per-block state of one piece as a checkpoint slice: the blocks that begin in the piece and
// are real (not padding rows), or nothing to save (none begins here, or an identical copy is saved by
// the rank holding the first columns: a last dimension of at most 256 split across ranks).
struct BlockSlice {
  std::vector<int64_t> global_shape;  // the parameter's, last dimension in blocks
  std::vector<int64_t> offsets;       // of this rank's slice in it
  std::vector<int64_t> slice_shape;   // this rank's slice (real rows), last dimension in blocks
  int64_t begin = 0;                  // first saved block, flat in the slice
  int64_t count = 0;
  int64_t piece_index = 0;            // that block's index in the piece's per-block tensor
};
std::optional<BlockSlice> block_slice(const model::Parameter& p, const PieceGeometry& piece);

// The blocks a piece touches within a loaded per-block slice (flat, shaped as block_slice's
// slice_shape): [first touched, first touched + n) clipped to the real blocks; returns the piece
// indices covered (the rest are padding blocks, zero).
struct BlockRange {
  int64_t slice_begin = 0, count = 0;
};
BlockRange touched_blocks(const model::Parameter& p, const PieceGeometry& piece);
// The slice shape, global shape and offsets under which p's per-block state is saved.
BlockSlice block_layout(const model::Parameter& p);

}  // namespace trainer::optim
