#pragma once
// Ulysses attention over the context-parallel group (parallel.cp_method "ulysses"; Jacobs et al.
// 2023): an all-to-all turns this rank's sequence part of every head into a share of the heads
// over the whole sequence (the zigzag chunks put back in sequence order), causal attention runs
// on those heads, and a second all-to-all brings the output back to the sequence part. Key/value
// heads that do not divide by cp are repeated first so that each rank holds the ones its query
// heads use (their gradients sum back through the repeat).
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace trainer::parallel {

// q [B, h, L, d], k and v [B, kv, L, d]: this rank's zigzag part (L = T / cp tokens). h must be a
// multiple of cp and of kv. Returns [B, h, L, d].
// `window` > 0: sliding-window attention (causal_sdpa's) over the gathered whole sequence.
// `documents` (data.document_masking; each position's document, int64 [B, T], the whole sequence's):
// each query sees only keys of its own document too (each document attended alone, causal_sdpa's).
at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& cp,
                             int64_t window = 0, const at::Tensor& documents = at::Tensor());

// Autograd all-to-alls of Ulysses, exposed for tests: [B, heads, L, d] sequence parts of all heads
// <-> [B, heads / cp, T, d] the whole sequence (in order) of this rank's heads.
at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& cp);
at::Tensor heads_to_sequence(const at::Tensor& x, comm::Communicator& cp);

}  // namespace trainer::parallel
