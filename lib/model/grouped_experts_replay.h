#pragma once
// The replay of the grouped experts (grouped_experts.cpp): one SwiGLU over every local expert's
// rows.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>
#include <vector>

#include "counting/replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// What the grouped experts saved for backward (grouped_experts.cpp).
struct GroupedSaved {
  Id rows = Timeline::kNone, h1 = Timeline::kNone, h3 = Timeline::kNone;
  int64_t n = 0;
};

// x: [n, H] grouped by expert, saved. Returns the output [n, H] (a partial sum over etp).
Id grouped_forward(Replay& r, Id x, int64_t n, GroupedSaved& g);

// Without autograd (the forward of recompute(full)): nothing saved, every tensor freed once its
// consumer has run.
Id grouped_nograd(Replay& r, int64_t n);

// go: the output gradient (not consumed). Returns the input gradient [n, H]; the weight
// gradients go into the parameters' .grad one expert at a time.
Id grouped_backward(Replay& r, Id go, GroupedSaved& g);

}  // namespace trainer::model::replays
