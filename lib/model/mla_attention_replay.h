#pragma once
// The replay of multi-head latent attention (mla_attention.cpp): norm, the down-projections in one
// column-parallel region, the latent norms, the up-projections, the rotary parts (DeepSeek's
// interleaved layout turned into halves by a copy), the query/key concatenations and the padded
// values, the attention core (attention_replay.h), o_proj and the residual.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Checked against the byte-counting CPU allocator
// (test/e2e/test_estimate.cpp).
#include "model/attention_replay.h"

namespace trainer::model::replays {

struct MlaBlock {
  NormSaved norm;
  Id norm_out = Timeline::kNone;  // saved by the down-projections
  NormSaved q_norm, kv_norm;      // the latent norms (saving q_a's output and kv_a's output)
  Id q_latent = Timeline::kNone;  // q_b_proj's input (the normalised query latent)
  Id kv_latent = Timeline::kNone; // kv_b_proj's input
  Id o_in = Timeline::kNone;
  AttentionSaved core;
  Id h = Timeline::kNone;
};

// x: the layer input [Tn, H]. Returns h = x + o_proj(mla(norm(x))).
Id mla_attention_forward(Replay& r, Id x, MlaBlock& a);
// g: the gradient of h (accumulated in place). Returns the gradient of the layer input.
Id mla_attention_backward(Replay& r, Id g, MlaBlock& a);
// Without autograd (the forward of recompute(full)).
Id mla_attention_nograd(Replay& r, Id x);

}  // namespace trainer::model::replays
