#pragma once
// Cross-entropy over a vocabulary split across tensor-parallel ranks (Megatron's
// vocab_parallel_cross_entropy): no rank ever holds full-vocabulary logits. The row maximum is
// reduced (max) over tp, then the sums of exponentials and the target logits together (sum) in one
// more collective; backward is local (softmax minus the one-hot target, on this rank's columns).
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace trainer::parallel {

// The sum over targets not equal to `ignore_index` of -log softmax(logits)[target]. logits:
// [N, V_local] fp32, this rank's vocabulary columns [vocab_begin, vocab_begin + V_local); columns
// at or past `vocab_end` (padding) take no part in the softmax. targets: int64 [N], global ids. The
// result, a 0-dim fp32 tensor, is the same on every rank of `tp`.
at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_begin,
                                            int64_t vocab_end, int64_t ignore_index, comm::Communicator& tp);

}  // namespace trainer::parallel
