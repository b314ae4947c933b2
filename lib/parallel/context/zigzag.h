#pragma once
// The load-balanced split of context parallelism (Megatron's 2*cp chunking, DESIGN.md section 6):
// each sequence is cut into 2 cp equal chunks and cp rank r holds chunks r and 2cp-1-r, in that
// order, so that every rank does the same causal-attention work. Token ids, labels and rotary
// positions all follow this split.
#include <ATen/core/Tensor.h>

namespace trainer::parallel {

// The global positions of rank `rank`'s tokens: int64 [seq_len / cp] (seq_len divisible by 2 cp).
at::Tensor zigzag_positions(int64_t seq_len, int64_t cp, int64_t rank, const at::TensorOptions& options);

// Rank `rank`'s part of `x` along `dim` (the whole sequence): its two chunks concatenated.
at::Tensor zigzag_take(const at::Tensor& x, int64_t dim, int64_t cp, int64_t rank);

// The inverse of taking every rank's part: `parts` [cp, ...] with the sequence along `dim` of each
// part (dim counted without the leading cp) -> the whole sequence in order.
at::Tensor zigzag_assemble(const at::Tensor& parts, int64_t dim);

// Splits the whole sequence along `dim` into every rank's part, stacked: [cp, ...].
at::Tensor zigzag_split(const at::Tensor& x, int64_t dim, int64_t cp);

}  // namespace trainer::parallel
