#pragma once
// The replay of a whole micro-batch (transformer.cpp): decoder layers under the recompute policy
// (recompute.cpp), the first stage's batch, rotary tables and embedding, the last stage's norm,
// LM head and loss (linear_cross_entropy.cpp).
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include "counting/replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...
// One micro-batch on one rank, as segments that compose: the level after a segment is the level
// before plus its net. A pipeline chunk's timeline is pre.forward, each layer's forward,
// head.forward, head.backward, each layer's backward in reverse, pre.backward, where pre and head
// are those of the first and last chunk of the model, or the receive and send between stages.
struct MicroBatchModel {
  LayerSegments pre_first;   // batch, rotary tables, embedding (and its backward)
  LayerSegments pre_other;   // rotary tables, the activation received from the previous stage
  LayerSegments dense;       // one dense decoder layer
  LayerSegments moe;         // one MoE decoder layer (empty without MoE)
  // The same layers with the sliding window of RankShape::window (empty without one).
  LayerSegments dense_window, moe_window;
  LayerSegments head_last;   // final norm, LM head, cross-entropy
  LayerSegments head_other;  // the send to the next stage, the gradient received back

  // A layer's segments by its feed-forward (MoE or dense) and its attention (windowed or full).
  const LayerSegments& layer(bool moe_layer, bool windowed) const {
    if (windowed) return moe_layer ? moe_window : dense_window;
    return moe_layer ? moe : dense;
  }
};

// Throws std::invalid_argument on a shape without rows, heads or vocabulary, or a dtype other than
// 2 or 4 bytes.
MicroBatchModel model_micro_batch(const RankShape& shape);

}  // namespace trainer::model::replays
