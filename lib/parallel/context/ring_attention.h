#pragma once
// Ring attention over the context-parallel group (parallel.cp_method "ring"; Liu et al. 2023 on
// the zigzag split of zigzag.h, as Megatron's context parallelism): causal attention of this
// rank's queries against the whole sequence's keys and values, which travel around the cp ring
// with asynchronous point-to-point while the current block is being attended (only the key/value
// heads travel). Block results are merged by their log-sum-exp in fp32, the local (diagonal)
// block first. With the zigzag split no off-diagonal block is masked or wasted: from a lower rank,
// every local query attends the sender's first chunk; from a higher rank, only the local second
// chunk attends both of the sender's chunks: half a block of work either way.
//
// One autograd function: backward sends the keys and values round the ring again, and each
// block's dK/dV (accumulated in fp32) travels with its block and returns to its owner after cp
// hops, each hop overlapping the next block's backward; dQ accumulates locally in fp32.
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace trainer::parallel {

// q [B, h, 2c, d], k and v [B, kv, 2c, d]: this rank's two zigzag chunks of c tokens each, in
// order. Returns [B, h, 2c, d] in q's dtype. `cp` of size 1: plain causal attention. `window` > 0
// (model.sliding_window): each query attends itself and the window - 1 tokens before it; the
// (query chunk, key chunk) pairs wholly outside the window are skipped, the others run as bands
// (attention_block.h). The blocks still travel the whole ring. `documents` (data.document_masking;
// each position's document, int64 [B, 2c * cp], the whole sequence's): each query sees only keys of
// its own document too; each block runs under its mask (attend_masked) and a block the mask
// empties is skipped.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& cp,
                          int64_t window = 0, const at::Tensor& documents = at::Tensor());

}  // namespace trainer::parallel
