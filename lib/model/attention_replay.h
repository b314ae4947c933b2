#pragma once
// The replay of the attention block (attention.cpp): norm, q/k/v projections, rotary, the
// attention core (attention_backend.cpp: flash SDPA, ring or Ulysses context parallelism from
// parallel/context), o_proj and the residual.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>

#include "counting/replay.h"
#include "model/parallel_linear_replay.h"
#include "model/rms_norm_replay.h"
#include "model/rotary_replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

struct AttentionSaved {
  Id q = Timeline::kNone, k = Timeline::kNone, v = Timeline::kNone, out = Timeline::kNone, lse = Timeline::kNone;
  Id mask = Timeline::kNone;  // a sliding window's [s, s] mask, where the mask path saves one
};

// --- the attention core (attention_core in attention.cpp) over this rank's shape: q [T, q_heads,
//     head_dim], k and v [T, kv_heads, head_dim]; flash SDPA, ring or Ulysses (parallel/context) -
// Returns out; `keep_lse` false when the core runs without autograd (selective recompute): then
// neither the log-sum-exp nor a window's mask stays.
Id attention_core_forward(Replay& r, bool keep_lse, Id& lse, Id& mask);
// The core run again with autograd at the start of backward (core_attention and selective
// recompute): out, the log-sum-exp and a window's mask saved into `a`.
void attention_core_again(Replay& r, AttentionSaved& a);
// Consumes the gradient of out and releases q, k, v, out, lse; returns dq, dk, dv.
void attention_core_backward(Replay& r, Id g, const AttentionSaved& a, Id& dq, Id& dk, Id& dv);

// --- attention block (attention.cpp) ------------------------------------------------------
struct AttentionBlock {
  NormSaved norm;
  Id norm_out = Timeline::kNone;  // saved by q, k, v projections
  Id o_in = Timeline::kNone;      // o_proj's input: a [s, b, h] view of the attention output
  AttentionSaved core;
  NormSaved q_norm, k_norm;       // model.qk_norm
  Id h = Timeline::kNone;         // x + attention: the residual stream
};

// x: the layer input [Tn, H]. Returns h = x + o_proj(attention(norm(x))).
Id attention_forward(Replay& r, Id x, AttentionBlock& a);

// g: gradient of h (the residual gradient, accumulated in place). Returns the gradient of the
// layer input (the same buffer after accumulation) and releases the block's saved tensors.
Id attention_backward(Replay& r, Id g, AttentionBlock& a);

// Without autograd (the forward of recompute(full)): nothing saved, every tensor freed once its
// consumer has run.
Id attention_nograd(Replay& r, Id x);

}  // namespace trainer::model::replays
