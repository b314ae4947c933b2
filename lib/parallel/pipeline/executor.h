#pragma once
// The step executor (DESIGN.md section 4): runs one step's list of actions (schedule.h) on this
// rank. A forward action calls the caller's chunk forward, which builds the micro-batch and
// returns the chunk's output (for the last chunk: the loss as backward should see it, a scalar);
// the executor keeps it until its backward, which starts from that output through the autograd
// engine directly with the output's gradient (ones for the loss; the gradient received from the
// next stage with pipelining): like Megatron's custom_backward, this needs only the output's graph
// node, not its data, so a stage can free an output's data once it is sent.
//
// Around each backward the gradient buffers learn the chunk and whether it is the chunk's last
// micro-batch of the step (the one whose gradients get reduced). Zero-bubble's split backward
// runs the input gradient now (BackwardInput) and the queued weight gradients later
// (BackwardWeight).
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <vector>

#include "model/weight_grad_queue.h"
#include "parallel/pipeline/schedule.h"

namespace trainer::parallel {

// Backward from `output` with its incoming gradient through the autograd engine; frees the graph.
void backward_from(const at::Tensor& output, const at::Tensor& grad);

class StepExecutor {
 public:
  using ChunkForward = std::function<at::Tensor(int64_t micro_batch, int64_t chunk)>;
  struct GradientHooks {
    std::function<void(int64_t chunk, bool last)> begin_backward;
    std::function<void(int64_t chunk)> end_backward;
  };

  // `weight_grads` is needed only for BackwardInput/BackwardWeight actions.
  StepExecutor(ChunkForward forward, GradientHooks hooks, model::WeightGradQueue* weight_grads);

  // Runs the actions in order (check_schedule must accept them).
  void run(const std::vector<Action>& actions);

 private:
  void backward(const Action& action, bool last, bool split);

  ChunkForward forward_;
  GradientHooks hooks_;
  model::WeightGradQueue* weight_grads_;
  std::map<std::pair<int64_t, int64_t>, at::Tensor> outputs_;  // (micro-batch, chunk) -> output awaiting backward
  std::map<std::pair<int64_t, int64_t>, size_t> deferred_;     // weight-gradient works queued by each B
};

}  // namespace trainer::parallel
