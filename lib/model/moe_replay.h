#pragma once
// The replay of the MoE feed-forward block (moe.cpp, expert_dispatcher.cpp): router, top-k, sort
// by expert, the rows through the grouped experts, weighted index_add back; with ep > 1 the
// dispatch and combine all-to-alls, with etp > 1 the gather of the etp group's rows and the
// return of the partial outputs; the shared experts as a dense MLP.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>

#include "counting/replay.h"
#include "model/grouped_experts_replay.h"
#include "model/layers_replay.h"
#include "model/parallel_linear_replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// --- MoE layer (moe.cpp) --------------------------------------------------------------------
struct MoeSaved {
  Id tokens = Timeline::kNone;
  Id probs = Timeline::kNone, top = Timeline::kNone, top_sum = Timeline::kNone;
  Id order = Timeline::kNone, token_of = Timeline::kNone;
  GroupedSaved experts;
  Id cat_out = Timeline::kNone, cat_w = Timeline::kNone, y = Timeline::kNone, cat_idx = Timeline::kNone;
  MlpSaved shared;
  bool has_shared = false;
  Id recv = Timeline::kNone;  // expert-parallel: the dispatched tokens this rank received
};

Id moe_block_forward(Replay& r, Id n2, MoeSaved& m);

Id moe_block_backward(Replay& r, Id g, MoeSaved& m);

// Without autograd (the forward of recompute(full)): nothing saved, every tensor freed once its
// consumer has run.
Id moe_block_nograd(Replay& r, Id tokens);

}  // namespace trainer::model::replays
