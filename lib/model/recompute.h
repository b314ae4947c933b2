#pragma once
// Activation recomputation: run `fn` without keeping its intermediate activations and run it
// again during backward to get them (the reentrant scheme of torch.utils.checkpoint). Only the
// inputs are saved. `fn` must be deterministic (our layers have no dropout).
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace trainer::model {

using TensorFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Same outputs as fn(inputs), with gradients flowing to the inputs and to every parameter fn uses.
std::vector<at::Tensor> recompute(TensorFunction fn, const std::vector<at::Tensor>& inputs);

// The two passes of a recomputed function, for autograd functions that recompute inside their own
// backward (model/parallel_linear.h's recomputed_linear): the first without autograd
// (RecomputePass::First), the replay on detached copies of the saved inputs with autograd on
// (RecomputePass::Replay); the replay's `inputs` are the leaves its outputs' graph leads to.
std::vector<at::Tensor> first_pass(const TensorFunction& fn, const std::vector<at::Tensor>& inputs);
struct Replayed {
  std::vector<at::Tensor> inputs, outputs;
};
Replayed replay(const TensorFunction& fn, const std::vector<at::Tensor>& saved);

// Which pass of a recomputed function is running on this thread: its first run (in forward, under
// no-grad) or its second (in backward). Layers that keep per-step state (MoE statistics) use it to
// count a micro-batch once and to replay the first pass's decisions.
enum class RecomputePass { None, First, Replay };
RecomputePass recompute_pass();

}  // namespace trainer::model
