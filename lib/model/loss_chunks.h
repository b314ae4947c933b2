#pragma once
// How many rows the chunked LM head + cross-entropy (model/linear_cross_entropy.h) takes at a
// time. Torch-free and header-only: the estimator's replay (lib/estimate) uses the same rule.
#include <algorithm>
#include <cstdint>

namespace trainer::model {

// Rows per chunk for `rows` rows of width `hidden` against `local_vocab` weight rows: the chunk's
// logits about as large as the input rows, ceil(local_vocab / hidden) chunks (at least one row
// per chunk).
inline int64_t loss_chunk_rows(int64_t rows, int64_t local_vocab, int64_t hidden) {
  const int64_t chunks = std::max<int64_t>(1, (local_vocab + std::max<int64_t>(hidden, 1) - 1) / std::max<int64_t>(hidden, 1));
  return std::max<int64_t>(1, (rows + chunks - 1) / chunks);
}

}  // namespace trainer::model
