#pragma once
// The blocks of 8-bit AdamW's quantised state over one parameter: each row of the parameter's last
// dimension is cut into chunks of 256 columns (the last chunk of a row may be shorter), numbered row
// by row. For a row length that is a multiple of 256 (every real model's matrices) these are the
// flat 256-element blocks of bitsandbytes. Blocks are defined on the parameter itself, not on a
// shard or a bucket: every mesh cuts the same blocks (a shard boundary inside a block only splits
// who computes its maximum), so each element's update and state are the same on every mesh.
#include <cstdint>

namespace trainer::optim {

inline constexpr int64_t kQuantBlock = 256;

struct BlockGrid {
  int64_t row_length = 1;      // elements of the last dimension (of the slice this rank holds)
  int64_t chunks_per_row = 1;  // ceil(row_length / 256)

  static BlockGrid of_row_length(int64_t row_length) {
    return {row_length, (row_length + kQuantBlock - 1) / kQuantBlock};
  }
  // The block of the element at flat (row-major) index i.
  int64_t block_of(int64_t i) const { return (i / row_length) * chunks_per_row + (i % row_length) / kQuantBlock; }
  // Flat index of a block's first element, and one past its last.
  int64_t block_begin(int64_t b) const { return (b / chunks_per_row) * row_length + (b % chunks_per_row) * kQuantBlock; }
  int64_t block_end(int64_t b) const {
    const int64_t chunk_end = (b % chunks_per_row + 1) * kQuantBlock;
    return (b / chunks_per_row) * row_length + (chunk_end < row_length ? chunk_end : row_length);
  }
  // Blocks touched by the flat range [offset, offset + length) (length > 0).
  int64_t first_block(int64_t offset) const { return block_of(offset); }
  int64_t blocks_touched(int64_t offset, int64_t length) const {
    return block_of(offset + length - 1) - block_of(offset) + 1;
  }
};

}  // namespace trainer::optim
