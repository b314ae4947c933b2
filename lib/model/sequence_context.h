#pragma once
// What every layer of one micro-batch shares about its sequences (Transformer::sequence_tables
// builds it once per micro-batch): the rotary tables of its positions, the MoE layers' token
// order and, with document masking, which keys each query may see.
#include <ATen/core/Tensor.h>

#include "parallel/context/document_mask.h"

namespace trainer::model {

struct SequenceContext {
  // [T, d] for the positions every sample shares, or [T, B, d] when positions restart at each
  // document (data.reset_positions).
  at::Tensor cos, sin;
  at::Tensor token_keys;  // the MoE layers' order of this rank's tokens (Moe::forward)
  // data.document_masking: which keys each query may see besides causality and windows (the
  // attention core's); undefined: one sequence per sample.
  parallel::DocumentMask documents;
};

}  // namespace trainer::model
