#pragma once
// The replay of the SwiGLU MLP (layers.cpp SwigluMlp, parallel_linear.cpp's recomputed down
// projection, kernels/swiglu).
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>
#include <utility>

#include "counting/replay.h"
#include "model/parallel_linear_replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// --- SwiGLU MLP (layers.cpp): down(silu(gate(x)) * up(x)). Lean (selective): the down
//     projection is one function that saves gate and up and recomputes the product in backward
//     (parallel_linear.cpp); otherwise autograd keeps silu(gate) and the product too -----------
struct MlpSaved {
  Id in = Timeline::kNone, gate = Timeline::kNone, up = Timeline::kNone;
  Id silu = Timeline::kNone, mul = Timeline::kNone;  // autograd's graph (not lean)
  int64_t rows = 0, width = 0;
  bool regather = false, lean = false;
};

// x [rows, H] (already gathered when sp); `saved` is what gate and up keep for backward (the
// sharded input with sp, regathered in backward); returns the (unreduced) output [rows, H].
Id mlp_forward(Replay& r, Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m, bool lean_mlp);

// g: gradient of the output [rows, H] (not consumed). Returns the gradient of the input, with
// `reduce` reduced over tp by the gate/up column-parallel backward.
Id mlp_backward(Replay& r, Id g, MlpSaved& m, bool reduce);

// Without autograd (the forward of recompute(full)): nothing saved, every tensor freed once its
// consumer has run.
Id mlp_nograd(Replay& r, Id x, int64_t rows, int64_t width);

}  // namespace trainer::model::replays
