#pragma once
// The softmax cross-entropy's two passes over a block of logits, for the chunked LM head + loss
// (lib/model/linear_cross_entropy.cpp): forward reads each row once for its maximum, its sum of
// exponentials and its target's logit; backward turns a block of logits into their gradient in
// place. fp32 arithmetic whatever the logits' type, so no fp32 copy of the block is made. Raw
// pointers; no torch or CUDA headers.
#include <cstdint>

#include "element_type.h"

namespace trainer::kernels {

// logits: [rows, cols] with row stride ld. target: int64 [rows], the column of each row's target
// in this block, or -1 when it is not here (another vocabulary piece, an ignored row). Writes fp32
// [rows]: row_max, sum_exp (of logit - row_max) and target_logit (0 where target is -1).
void cross_entropy_row_stats(const void* logits, int64_t rows, int64_t cols, int64_t ld, const int64_t* target,
                             float* row_max, float* sum_exp, float* target_logit, ElementType type, Stream stream);

// grad[r, c] = (exp(logits[r, c] - lse[r]) - (c == target[r])) * coef[r], rounded once to the
// element type; grad may be logits itself (in place). lse and coef: fp32 [rows]; target as above.
void cross_entropy_logit_grad(const void* logits, int64_t ld, void* grad, int64_t grad_ld, int64_t rows, int64_t cols,
                              const float* lse, const int64_t* target, const float* coef, ElementType type,
                              Stream stream);

}  // namespace trainer::kernels
