#pragma once
// The replay of RMSNorm (rms_norm.cpp, fused_ops.cpp): the norm function (lean layers, fused
// kernel) or autograd's graph of the same arithmetic.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>

#include "counting/replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// --- RMSNorm (rms_norm.cpp): x32 = x.float(); rstd = rsqrt(mean(x32^2) + eps);
//     out = w * (x32 * rstd).to(dtype); lean: one autograd function saving x and rstd only, its
//     backward dx = rstd (g w - xhat mean(g w xhat)); otherwise autograd's graph ------------
struct NormSaved {
  Id x = Timeline::kNone, rs = Timeline::kNone;
  Id x32 = Timeline::kNone, normed = Timeline::kNone;  // autograd's graph (not lean)
  int64_t tokens = 0;
  int64_t width = 0;  // the normalised dimension: hidden_size, or head_dim for the q/k norms
  bool lean = false;
  bool fused = false;  // ATen's fused RMSNorm (fused_ops.cpp): saves x and rstd like lean
};

// Lean layers (recompute policy selective) run the norm function; the others autograd's graph;
// with the fused kernel, ATen's fused norm either way.
Id norm_forward(Replay& r, Id x, int64_t tokens, NormSaved& saved);

// Returns the gradient of x (g is consumed). With `resid` (the residual stream's gradient
// buffer) the result is accumulated into it in place, as autograd's input buffer does, and
// `resid` is returned.
Id norm_backward(Replay& r, Id g, const NormSaved& saved, Id resid);

// Without autograd (the forward of recompute(full)): nothing saved, every tensor freed once its
// consumer has run.
Id norm_nograd(Replay& r, Id x, int64_t tokens);

// model.qk_norm's per-head norms (attention.cpp): the norm function (never fused) over `rows` rows
// of `width` (tokens x heads rows of head_dim). The input `x` is saved (held until norm_backward);
// the caller's own reference to it is the caller's to drop.
Id head_norm_forward(Replay& r, Id x, int64_t rows, int64_t width, NormSaved& saved);
// The same without autograd: nothing is saved; `x` stays the caller's.
Id head_norm_nograd(Replay& r, Id x, int64_t rows, int64_t width);

}  // namespace trainer::model::replays
