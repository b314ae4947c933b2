#pragma once
// Document masking (data.document_masking) under ring attention: a query sees only keys of its own
// document, besides causality and any sliding window. Every attention path takes each position's
// document over the whole sequence, int64 [B, T * cp] (numbered from 0 in each sample,
// increasing): at cp 1 and in Ulysses' gathered sequence each document runs alone (causal_sdpa.h);
// ring attention's ranks hold zigzag parts of the sequence and build each block's mask here.
#include <ATen/core/Tensor.h>

namespace trainer::parallel {

// The keys that queries at global positions `query_positions` [Lq] see among keys at global
// positions `key_positions` [Lk] (int64, on ids' device): bool [B, 1, Lq, Lk], true where the key
// is in the query's document, not in its future and, with `window` > 0, fewer than window
// positions before it.
at::Tensor document_block_mask(const at::Tensor& ids, const at::Tensor& query_positions,
                               const at::Tensor& key_positions, int64_t window);

}  // namespace trainer::parallel
