#pragma once
// The LM head and the cross-entropy together, in chunks of rows (Liger-Kernel's fused linear
// cross-entropy, with recomputation instead of gradients computed in forward): forward computes
// each chunk's logits, its log-sum-exp and target logit, and keeps only the log-sum-exp per row;
// backward goes over slices of the vocabulary, computes each slice's logits for all rows again and
// turns them into gradients (softmax minus the one-hot target): the slice's rows of the weight
// gradient in one GEMM, and its part of the input gradient, summed over slices in fp32 at least.
// No [rows, V] tensor exists for more than one chunk at a time, in fp32 or otherwise.
//
// Vocabulary parallelism (Megatron's vocab_parallel_cross_entropy) is the same loop: each tp rank
// holds rows [vocab_begin, ...) of the weight, and per chunk the row maximum (max) and then the
// sums of exponentials and the target logits (sum) are reduced over tp; backward needs no
// communication. Weight rows past `vocab_end` (a padded vocabulary) take no part.
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"
#include "model/fused_kernels.h"
#include "counting/loss_chunks.h"
#include "model/parameter.h"
#include "model/weight_grad_queue.h"

namespace trainer::model {

// The sum over rows whose target is not `ignore_index` of -log softmax(h W^T)[target], the softmax
// over global ids [0, vocab_end). h: [N, H] in the model dtype (the whole sequence on every tp
// rank); weight: its local rows [V_local, H] hold global ids [vocab_begin, vocab_begin + V_local);
// targets: int64 [N], global ids. Logits are computed in fp32 at least. `tp` (null: one rank)
// reduces the softmax over the vocabulary pieces. The result, a 0-dim tensor of at least fp32, is
// the same on every rank of tp. The weight's gradient goes into the parameter
// (model::accumulate_gradient, once per call), deferred with `queue` when it defers. `kernels`:
// cross_entropy computes the softmax statistics and logit gradients by kernels/cross_entropy and
// grad_accumulation sums the bf16 products into fp32 by the GEMMs (fusable h only).
at::Tensor linear_cross_entropy_sum(const at::Tensor& h, Parameter& weight, WeightGradQueue* queue,
                                    const at::Tensor& targets, int64_t vocab_begin, int64_t vocab_end,
                                    int64_t ignore_index, comm::Communicator* tp, int64_t chunk_rows,
                                    const FusedKernels& kernels = {});

}  // namespace trainer::model
