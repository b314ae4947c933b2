#pragma once
// What a micro-batch brings besides its tokens and targets, for the model's last chunk or every
// chunk; each tensor is undefined when its feature is off. Split like the inputs under context
// parallelism (train/batch.h).
#include <ATen/core/Tensor.h>

namespace trainer::model {

struct TokenContext {
  at::Tensor mtp_ahead;  // multi-token prediction's tokens and targets ahead (mtp.h), int64 [2, D, B, T]
  // data.document_masking: each position's document in its sample, int64 [B, T]; under context
  // parallelism the whole sequence's (not split: attention builds its masks from it), reordered
  // for ring attention (parallel/context/document_layout.h).
  at::Tensor documents;
  // data.reset_positions, or a sequence reordered for ring attention: each position's rotary
  // position, int64 [B, T].
  at::Tensor positions;
};

}  // namespace trainer::model
