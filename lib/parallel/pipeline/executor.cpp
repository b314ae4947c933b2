#include "parallel/pipeline/executor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

namespace trainer::parallel {

void backward_from(const at::Tensor& output, const at::Tensor& grad) {
  // The engine checks the gradient against the shape recorded in the graph, not output's data.
  torch::autograd::Engine::get_default_engine().execute({torch::autograd::impl::gradient_edge(output)}, {grad},
                                                        /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true, /*outputs=*/{});
}

StepExecutor::StepExecutor(ChunkForward forward, GradientHooks hooks, model::WeightGradQueue* weight_grads)
    : forward_(std::move(forward)), hooks_(std::move(hooks)), weight_grads_(weight_grads) {}

void StepExecutor::run(const std::vector<Action>& actions) {
  check_schedule(actions);
  std::map<int64_t, size_t> last_backward;  // chunk -> index of its last (input) backward
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == Action::Kind::Backward || actions[i].kind == Action::Kind::BackwardInput)
      last_backward[actions[i].chunk] = i;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const std::pair<int64_t, int64_t> key{a.micro_batch, a.chunk};
    switch (a.kind) {
      case Action::Kind::Forward:
        outputs_[key] = forward_(a.micro_batch, a.chunk);
        break;
      case Action::Kind::Backward:
      case Action::Kind::BackwardInput:
        backward(a, i == last_backward[a.chunk], a.kind == Action::Kind::BackwardInput);
        break;
      case Action::Kind::BackwardWeight:
        weight_grads_->run_oldest(deferred_.at(key));
        deferred_.erase(key);
        break;
    }
  }
}

void StepExecutor::backward(const Action& a, bool last, bool split) {
  const std::pair<int64_t, int64_t> key{a.micro_batch, a.chunk};
  const at::Tensor output = outputs_.at(key);
  outputs_.erase(key);
  if (split && !weight_grads_)
    throw std::logic_error(fmt::format("{}: a split backward needs the model's weight-gradient queue", to_string(a)));
  if (hooks_.begin_backward) hooks_.begin_backward(a.chunk, last);
  const size_t before = weight_grads_ ? weight_grads_->pending() : 0;
  if (split) weight_grads_->set_deferring(true);
  backward_from(output, at::ones_like(output));
  if (split) {
    weight_grads_->set_deferring(false);
    deferred_[key] = weight_grads_->pending() - before;
  }
  if (hooks_.end_backward) hooks_.end_backward(a.chunk);
}

}  // namespace trainer::parallel
