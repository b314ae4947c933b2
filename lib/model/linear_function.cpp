#include "model/linear_function.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries the parameter (and queue) to backward through the context; IValue capsules hold
// ref-counted objects.
struct WeightHandle : torch::CustomClassHolder {
  WeightHandle(Parameter* p, WeightGradQueue* q) : param(p), queue(q) {}
  Parameter* param;
  WeightGradQueue* queue;
};

// The full weight for one use, released by the destructor (ZeRO-3 gathers; otherwise the tensor).
class WeightUse {
 public:
  explicit WeightUse(Parameter& p) : p_(p), weight_(p.gather ? p.gather() : p.tensor.detach()) {}
  ~WeightUse() {
    if (p_.gather && p_.release) p_.release();
  }
  WeightUse(const WeightUse&) = delete;
  WeightUse& operator=(const WeightUse&) = delete;
  const at::Tensor& get() const { return weight_; }

 private:
  Parameter& p_;
  at::Tensor weight_;
};

// The weight gradient now, or queued when the layer has a queue that is deferring.
void weight_gradient(WeightGradQueue* queue, std::function<void()> work) {
  if (queue)
    queue->submit(std::move(work));
  else
    work();
}

c10::intrusive_ptr<WeightHandle> handle_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<WeightHandle>(ctx->saved_data["weight"].toCapsule());
}

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  // `weight_leaf` is the parameter's tensor: passed so that the output requires grad, never read.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle) {
    (void)weight_leaf;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->save_for_backward({x});
    const WeightUse w(*handle->param);
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.get().size(0);
    return x.reshape({-1, x.size(-1)}).mm(w.get().t()).view(shape);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->param;
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor go = grads[0].reshape({-1, grads[0].size(-1)});
    at::Tensor grad_x;
    if (ctx->needs_input_grad(0)) {
      const WeightUse w(p);
      grad_x = go.mm(w.get()).view(x.sizes());
    }
    if (ctx->needs_input_grad(1))
      weight_gradient(handle->queue, [go, x, &p] { accumulate_gradient(p, go.t().mm(x.reshape({-1, x.size(-1)}))); });
    return {grad_x, at::Tensor(), at::Tensor()};
  }
};

struct EmbeddingFunction : public torch::autograd::Function<EmbeddingFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& tokens, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle) {
    (void)weight_leaf;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->save_for_backward({tokens});
    const WeightUse w(*handle->param);
    ctx->saved_data["rows"] = w.get().size(0);
    return at::embedding(w.get(), tokens);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->param;
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

at::Tensor linear(const at::Tensor& x, Parameter& weight, WeightGradQueue* queue) {
  return LinearFunction::apply(x, weight.tensor, c10::make_intrusive<WeightHandle>(&weight, queue));
}

at::Tensor embedding(const at::Tensor& tokens, Parameter& weight, WeightGradQueue* queue) {
  return EmbeddingFunction::apply(tokens, weight.tensor, c10::make_intrusive<WeightHandle>(&weight, queue));
}

}  // namespace trainer::model
