// ParameterSet::mark_unit_output / mark_unit_input: identities in the autograd graph whose backward
// tells ZeRO-3 where a forward unit's backward begins and ends (as FSDP's pre- and post-backward
// hooks do), so that it gathers the unit's parameters just before and releases them just after.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/parameter.h"

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HookHolder : torch::CustomClassHolder {
  explicit HookHolder(std::function<void()> f) : call(std::move(f)) {}
  std::function<void()> call;
};

// Forward: x unchanged (a view, as an identity function must return). Backward: the hook, then
// the gradient unchanged.
struct UnitBoundary : public torch::autograd::Function<UnitBoundary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<HookHolder> hook) {
    ctx->saved_data["hook"] = c10::IValue::make_capsule(std::move(hook));
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::static_intrusive_pointer_cast<HookHolder>(ctx->saved_data["hook"].toCapsule())->call();
    return {grads[0], at::Tensor()};
  }
};

at::Tensor boundary(const at::Tensor& x, const std::function<void(int64_t)>& hook, int64_t unit) {
  if (!hook || !x.requires_grad() || !at::GradMode::is_enabled()) return x;
  return UnitBoundary::apply(x, c10::make_intrusive<HookHolder>([hook, unit] { hook(unit); }));
}

}  // namespace

at::Tensor ParameterSet::mark_unit_output(const at::Tensor& x, int64_t unit) const {
  return boundary(x, hooks_.before_backward, unit);
}

at::Tensor ParameterSet::mark_unit_input(const at::Tensor& x, int64_t unit) const {
  return boundary(x, hooks_.after_backward, unit);
}

}  // namespace trainer::model
