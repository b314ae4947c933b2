#pragma once
// Internal to lib/model: what the custom linear functions (linear_function.cpp,
// parallel_linear.cpp) share: carrying parameters and functions to backward, taking a weight for
// one use, and computing a weight gradient now or queueing it.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <vector>

#include "model/parameter.h"
#include "model/recompute.h"
#include "model/weight_grad_queue.h"

namespace trainer::model::detail {

// Carries the parameters (and queue) to backward through the context; IValue capsules hold
// ref-counted objects.
struct WeightHandle : torch::CustomClassHolder {
  WeightHandle(std::vector<Parameter*> p, WeightGradQueue* q) : params(std::move(p)), queue(q) {}
  std::vector<Parameter*> params;
  WeightGradQueue* queue;
};

inline c10::intrusive_ptr<WeightHandle> handle_of(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<WeightHandle>(ctx->saved_data["weight"].toCapsule());
}

// A function run again in backward (model/recompute.h): carried there in a capsule.
struct FunctionHolder : torch::CustomClassHolder {
  explicit FunctionHolder(TensorFunction f) : fn(std::move(f)) {}
  TensorFunction fn;
};

// A linear's input computed again in backward instead of saved (model/layers.h's InputAgain).
struct InputAgainHandle : torch::CustomClassHolder {
  explicit InputAgainHandle(std::function<at::Tensor()> f) : compute(std::move(f)) {}
  std::function<at::Tensor()> compute;
};

inline c10::intrusive_ptr<InputAgainHandle> again_handle(const std::function<at::Tensor()>& again) {
  return again ? c10::make_intrusive<InputAgainHandle>(again) : c10::intrusive_ptr<InputAgainHandle>();
}

// The input a linear saved, or computed again.
inline at::Tensor saved_input(torch::autograd::AutogradContext* ctx, const at::Tensor& saved) {
  if (!ctx->saved_data.count("again")) return saved;
  return c10::static_intrusive_pointer_cast<InputAgainHandle>(ctx->saved_data["again"].toCapsule())->compute();
}

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
inline void weight_gradient(WeightGradQueue* queue, std::function<void()> work) {
  if (queue)
    queue->submit(std::move(work));
  else
    work();
}

// Rows of x folded to 2-D, as at::linear does.
inline at::Tensor rows_of(const at::Tensor& x) { return x.reshape({-1, x.size(-1)}); }

}  // namespace trainer::model::detail
