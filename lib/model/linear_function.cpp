#include "model/linear_function.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/weight_use.h"

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using detail::WeightHandle;
using detail::WeightUse;
using detail::handle_of;
using detail::weight_gradient;

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  // `weight_leaf` is the parameter's tensor: passed so that the output requires grad, never read.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle, c10::intrusive_ptr<detail::InputAgainHandle> again) {
    (void)weight_leaf;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    if (again)
      ctx->saved_data["again"] = c10::IValue::make_capsule(again);
    else
      ctx->save_for_backward({x});
    const WeightUse w(*handle->params[0]);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.get().size(0);
    return x.reshape({-1, x.size(-1)}).mm(w.get().t()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->params[0];
    const auto saved = ctx->get_saved_variables();
    const at::Tensor x = detail::saved_input(ctx, saved.empty() ? at::Tensor() : saved[0]);
    const at::Tensor go = grads[0].reshape({-1, grads[0].size(-1)});
    at::Tensor grad_x;
    if (ctx->needs_input_grad(0)) {
      const WeightUse w(p);
      grad_x = go.mm(w.get()).view(x.sizes());
    }
    if (ctx->needs_input_grad(1))
      weight_gradient(handle->queue,
                      [go, x, &p] { accumulate_gradient_mm(p, go.t(), x.reshape({-1, x.size(-1)})); });
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct EmbeddingFunction : public torch::autograd::Function<EmbeddingFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& tokens, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle) {
    (void)weight_leaf;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->save_for_backward({tokens});
    const WeightUse w(*handle->params[0]);
    ctx->saved_data["rows"] = w.get().size(0);
    return at::embedding(w.get(), tokens);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->params[0];
    const at::Tensor tokens = ctx->get_saved_variables()[0];
    if (ctx->needs_input_grad(1))
      weight_gradient(handle->queue, [go = grads[0], tokens, rows = ctx->saved_data["rows"].toInt(), &p] {
        accumulate_gradient(p, at::embedding_backward(go, tokens, rows, /*padding_idx=*/-1,
                                                      /*scale_grad_by_freq=*/false, /*sparse=*/false));
      });
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, Parameter& weight, WeightGradQueue* queue,
                  const std::function<at::Tensor()>& again) {
  return LinearFunction::apply(x, weight.tensor, c10::make_intrusive<WeightHandle>(std::vector<Parameter*>{&weight}, queue),
                               detail::again_handle(again));
}

at::Tensor embedding(const at::Tensor& tokens, Parameter& weight, WeightGradQueue* queue) {
  return EmbeddingFunction::apply(tokens, weight.tensor, c10::make_intrusive<WeightHandle>(std::vector<Parameter*>{&weight}, queue));
}

}  // namespace trainer::model
