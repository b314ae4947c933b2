#pragma once
// The replay of rotary embeddings (rotary.cpp, kernels/rope).
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>

#include "counting/replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// --- rotary (rotary.cpp): x * cos + cat(-x2, x1) * sin; cos and sin need no gradient, so the
//     muls save only them and the input is freed once rotated -----------------------------------
Id rope_forward(Replay& r, Id x, int64_t bytes);

Id rope_backward(Replay& r, Id g, int64_t bytes);
// The tables (Rotary::cos_sin): positions, outer product, cat, cos and sin in fp32, cast to the
// model dtype; kept for the whole micro-batch.
struct RotaryTables {
  Id cos = Timeline::kNone, sin = Timeline::kNone;
};
RotaryTables rotary_tables(Replay& r);

}  // namespace trainer::model::replays
