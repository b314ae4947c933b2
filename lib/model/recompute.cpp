#include "model/recompute.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/core/ivalue.h>

#include "model/weight_use.h"

namespace trainer::model {

namespace {

thread_local RecomputePass current_pass = RecomputePass::None;

// Sets the pass for one scope, restoring the outer one (recomputed functions nest).
struct PassScope {
  explicit PassScope(RecomputePass pass) : saved(current_pass) { current_pass = pass; }
  ~PassScope() { current_pass = saved; }
  RecomputePass saved;
};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using detail::FunctionHolder;

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // `inputs` must reach Function::apply as a TensorList: apply's variable extraction treats a
  // std::vector<at::Tensor> argument as a non-tensor, which would cut the outputs off the graph.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<FunctionHolder> holder, at::TensorList inputs) {
    ctx->saved_data["fn"] = c10::IValue::make_capsule(holder);
    ctx->save_for_backward(inputs.vec());
    return first_pass(holder->fn, inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto holder = c10::static_intrusive_pointer_cast<FunctionHolder>(ctx->saved_data["fn"].toCapsule());
    auto [inputs, outputs] = replay(holder->fn, ctx->get_saved_variables());
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].requires_grad() || !grad_outputs[i].defined()) continue;
      roots.push_back(outputs[i]);
      grads.push_back(grad_outputs[i]);
    }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result = {at::Tensor()};  // no gradient for the function holder
    for (const auto& input : inputs) result.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    return result;
  }
};

}  // namespace

RecomputePass recompute_pass() { return current_pass; }

std::vector<at::Tensor> first_pass(const TensorFunction& fn, const std::vector<at::Tensor>& inputs) {
  at::NoGradGuard no_grad;
  PassScope pass(RecomputePass::First);
  return fn(inputs);
}

Replayed replay(const TensorFunction& fn, const std::vector<at::Tensor>& saved) {
  Replayed r;
  for (const auto& s : saved) r.inputs.push_back(s.detach().requires_grad_(s.requires_grad()));
  at::AutoGradMode enable(true);
  PassScope pass(RecomputePass::Replay);
  r.outputs = fn(r.inputs);
  return r;
}

std::vector<at::Tensor> recompute(TensorFunction fn, const std::vector<at::Tensor>& inputs) {
  return RecomputeFunction::apply(c10::make_intrusive<FunctionHolder>(std::move(fn)), at::TensorList(inputs));
}

}  // namespace trainer::model
