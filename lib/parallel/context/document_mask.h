#pragma once
// Document masking (data.document_masking) as the attention paths take it: a query sees only keys
// of its own document, besides causality and any sliding window. At cp 1 the layers share one
// boolean mask over the sequence on a GPU, while the CPU attends each document alone; under context
// parallelism each rank holds a zigzag part of the sequence, so ring and Ulysses attention get
// every position's document over the whole sequence and build the mask of each block they attend.
#include <ATen/core/Tensor.h>

namespace trainer::parallel {

struct DocumentMask {
  // cp 1 on a GPU: bool [B, 1, T, T], true where query and key are in the same document, built
  // once per micro-batch for every layer.
  at::Tensor same;
  // int64 [B, T * cp], each position's document in its sample (numbered from 0, increasing), the
  // whole sequence in order.
  at::Tensor ids;
  bool defined() const { return same.defined() || ids.defined(); }
};

// ids int64 [B, T] -> bool [B, 1, T, T]: query i and key j in the same document.
at::Tensor same_document(const at::Tensor& ids);

// The keys that queries at global positions `query_positions` [Lq] see among keys at global
// positions `key_positions` [Lk] (int64, on ids' device): bool [B, 1, Lq, Lk], true where the key
// is in the query's document, not in its future and, with `window` > 0, fewer than window
// positions before it.
at::Tensor document_block_mask(const at::Tensor& ids, const at::Tensor& query_positions,
                               const at::Tensor& key_positions, int64_t window);

}  // namespace trainer::parallel
