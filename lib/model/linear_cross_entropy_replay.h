#pragma once
// The replay of the LM head and the cross-entropy loss (linear_cross_entropy.cpp, kernels/
// cross_entropy): the logits in chunks of rows in forward (counting/loss_chunks.h), again by
// vocabulary slices in backward, weight and input gradients summed in fp32.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Checked against the byte-counting CPU allocator
// (test/e2e/test_estimate.cpp).
#include "counting/replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// Forward over the rows the loss function saved (the norm's output, gathered with sp): returns the
// fp32 log-sum-exp per row it saves.
Id loss_forward(Replay& r);
// Backward: returns the gradient of the loss function's input rows in the model dtype; the head's
// weight gradient goes into main_grad.
Id loss_backward(Replay& r);

}  // namespace trainer::model::replays
