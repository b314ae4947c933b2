#pragma once
// What every layer of one micro-batch shares about its sequences (Transformer::sequence_tables
// builds it once per micro-batch): the rotary tables of its positions, the MoE layers' token
// order and, with document masking, which keys each query may see.
#include <ATen/core/Tensor.h>

namespace trainer::model {

struct SequenceContext {
  // [T, d] for the positions every sample shares, or [T, B, d] when positions restart at each
  // document (data.reset_positions).
  at::Tensor cos, sin;
  at::Tensor token_keys;  // the MoE layers' order of this rank's tokens (Moe::forward)
  // data.document_masking: each position's document, int64 [B, T * cp] over the whole sequence
  // (the attention core's, parallel/context/causal_sdpa.h); undefined: one sequence per sample.
  at::Tensor documents;
};

}  // namespace trainer::model
