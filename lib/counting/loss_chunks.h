#pragma once
// How many rows (forward) and vocabulary rows (backward) the chunked LM head + cross-entropy
// (model/linear_cross_entropy.h) takes at a time. Torch-free and header-only, below both model and
// estimate: the estimator's replay uses the same rule.
#include <algorithm>
#include <cstdint>

namespace trainer::counting {

// Rows per chunk for `rows` rows of width `hidden` against `local_vocab` weight rows: the chunk's
// logits about as large as the input rows, ceil(local_vocab / hidden) chunks (at least one row
// per chunk).
inline int64_t loss_chunk_rows(int64_t rows, int64_t local_vocab, int64_t hidden) {
  const int64_t chunks = std::max<int64_t>(1, (local_vocab + std::max<int64_t>(hidden, 1) - 1) / std::max<int64_t>(hidden, 1));
  return std::max<int64_t>(1, (rows + chunks - 1) / chunks);
}

// Backward goes over the vocabulary instead, in slices of this many weight rows: each slice's
// logits [rows, slice] are about as large as a forward chunk's, its weight gradient is one GEMM over
// all rows written once (over row chunks, every chunk would add a whole [V, H] piece into the
// gradient: on an H100/H200 that was a fifth of a 1B model's step), and the input gradient
// accumulates over slices.
// Slices of 64 rows or more are rounded up to a multiple of 64: the slice's logits [rows, slice]
// are a GEMM operand, and with a leading dimension that is not a multiple of 8 bf16 elements
// cuBLAS leaves its Hopper kernels for slow 4-byte-aligned ones (seen on an H200: slices of 2036
// made the three slice GEMMs 2.5x slower than aligned ones).
inline int64_t loss_vocab_slice(int64_t local_vocab, int64_t hidden) {
  const int64_t chunks = std::max<int64_t>(1, (local_vocab + std::max<int64_t>(hidden, 1) - 1) / std::max<int64_t>(hidden, 1));
  const int64_t slice = std::max<int64_t>(1, (local_vocab + chunks - 1) / chunks);
  if (slice < 64) return slice;
  return std::min(local_vocab, (slice + 63) / 64 * 64);
}

}  // namespace trainer::counting
