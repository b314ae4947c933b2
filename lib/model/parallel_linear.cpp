#include "model/parallel_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <tuple>

#include "model/fused_ops.h"
#include "model/weight_use.h"
#include "parallel/tensor/collective_matmul.h"
#include "parallel/tensor/group_handle.h"

namespace trainer::model {

namespace {

using detail::handle_of;
using detail::rows_of;
using detail::weight_gradient;
using detail::WeightHandle;
using detail::FunctionHolder;
using detail::WeightUse;
using parallel::GroupHandle;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

comm::Communicator& group_of(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule())->group;
}

// An all-gather along dim 0 in flight; `input` is kept alive until wait().
struct Gather {
  at::Tensor input, output;
  std::unique_ptr<comm::Work> work;
  Gather(const at::Tensor& x, comm::Communicator& g) : input(x.contiguous()) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] *= g.size();
    output = at::empty(shape, x.options());
    work = g.all_gather(output, input);
  }
  at::Tensor wait() {
    work->wait();
    return output;
  }
};

// Reduce-scatter along dim 0: this rank's [s / n, ...] of the sum of every rank's [s, ...].
std::unique_ptr<comm::Work> start_reduce_scatter(at::Tensor& out, const at::Tensor& full, comm::Communicator& g) {
  std::vector<int64_t> shape = full.sizes().vec();
  shape[0] /= g.size();
  out = at::empty(shape, full.options());
  return g.reduce_scatter(out, full, comm::ReduceOp::Sum);
}

// A row-parallel output: the partial products summed over tp, all-reduced in place (`partial`
// is a fresh tensor) or, with sequence parallelism, reduce-scattered along the sequence.
at::Tensor sum_row_parallel(at::Tensor partial, comm::Communicator& tp, bool sequence_parallel) {
  if (!sequence_parallel) {
    tp.all_reduce(partial, comm::ReduceOp::Sum)->wait();
    return partial;
  }
  at::Tensor out;
  start_reduce_scatter(out, partial, tp)->wait();
  return out;
}

std::vector<int64_t> with_last(const at::Tensor& x, int64_t last) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = last;
  return shape;
}

// y = x W^T summed over tp like sum_row_parallel (`tp` null: one rank, no sum); with sequence
// parallelism and `overlap` the reduce-scatter is a ring pipelined with the GEMM's chunks
// (parallel/tensor/collective_matmul.h).
at::Tensor row_parallel_product(const at::Tensor& x, const at::Tensor& weight, comm::Communicator* tp,
                                bool sequence_parallel, bool overlap) {
  if (tp && sequence_parallel && overlap) return parallel::matmul_reduce_scatter(x, weight.t(), *tp);
  at::Tensor partial = rows_of(x).mm(weight.t()).view(with_last(x, weight.size(0)));
  return tp ? sum_row_parallel(std::move(partial), *tp, sequence_parallel) : partial;
}

// A row-parallel backward's output gradient gathered along the sequence (sequence parallelism).
// With `overlap` and `weight` (the input gradient wanted), the gather is a ring that multiplies
// each arriving chunk by the weight: *grad_input = gathered W (collective matmul); otherwise
// *grad_input is left undefined for the caller to compute.
at::Tensor gather_output_grad(const at::Tensor& g, comm::Communicator& tp, bool overlap, Parameter* weight,
                              at::Tensor* grad_input) {
  if (!overlap || weight == nullptr) return Gather(g, tp).wait();
  const WeightUse w(*weight);
  at::Tensor gathered;
  *grad_input = parallel::all_gather_matmul(g, {w.get()}, tp, &gathered).at(0);
  return gathered;
}

struct ColumnParallelLinear : public torch::autograd::Function<ColumnParallelLinear> {
  // `weight_leaves` are the parameters' tensors: passed so that the outputs require grad, never read.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weight_leaves,
                               c10::intrusive_ptr<WeightHandle> handle, c10::intrusive_ptr<GroupHandle> group,
                               bool sequence_parallel, bool overlap,
                               c10::intrusive_ptr<detail::InputAgainHandle> again) {
    (void)weight_leaves;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["sp"] = sequence_parallel;
    if (again)
      ctx->saved_data["again"] = c10::IValue::make_capsule(again);
    else
      ctx->save_for_backward({x});  // with sp the chunk, not the gathered copy
    if (sequence_parallel && overlap) {
      // Every weight's rows of each arriving chunk, while the next chunk travels.
      std::vector<std::unique_ptr<WeightUse>> uses;
      std::vector<at::Tensor> transposed;
      for (Parameter* p : handle->params) {
        uses.push_back(std::make_unique<WeightUse>(*p));
        transposed.push_back(uses.back()->get().t());
      }
      return parallel::all_gather_matmul(x, transposed, *group->group);
    }
    const at::Tensor total = sequence_parallel ? Gather(x, *group->group).wait() : x;
    variable_list outputs;
    for (Parameter* p : handle->params) {
      const WeightUse w(*p);
      outputs.push_back(rows_of(total).mm(w.get().t()).view(with_last(total, w.get().size(0))));
    }
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    comm::Communicator& tp = group_of(ctx);
    const bool sp = ctx->saved_data["sp"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor x = detail::saved_input(ctx, saved.empty() ? at::Tensor() : saved[0]);
    const size_t n = handle->params.size();
    // With sp the input is gathered again while the input-gradient GEMMs run.
    std::optional<Gather> regather;
    if (sp) regather.emplace(x, tp);
    at::Tensor grad_total;
    std::unique_ptr<comm::Work> reduce;
    at::Tensor grad_x;
    if (ctx->needs_input_grad(0)) {
      for (size_t i = 0; i < n; ++i) {
        if (!grads[i].defined()) continue;
        const WeightUse w(*handle->params[i]);
        const at::Tensor g = rows_of(grads[i]).mm(w.get());
        grad_total = grad_total.defined() ? grad_total.add_(g) : g;
      }
      // The input gradient's collective runs while the weight gradients are computed.
      if (sp)
        reduce = start_reduce_scatter(grad_x, grad_total, tp);
      else
        reduce = tp.all_reduce(grad_total, comm::ReduceOp::Sum), grad_x = grad_total;
    }
    const at::Tensor total = sp ? regather->wait() : x;
    for (size_t i = 0; i < n; ++i) {
      if (!grads[i].defined() || !ctx->needs_input_grad(1 + i)) continue;
      Parameter& p = *handle->params[i];
      weight_gradient(handle->queue,
                      [go = rows_of(grads[i]), in = rows_of(total), &p] { accumulate_gradient_mm(p, go.t(), in); });
    }
    variable_list result(1 + n + 5);
    if (reduce) {
      reduce->wait();
      result[0] = grad_x.view(x.sizes());
    }
    return result;
  }
};

struct RowParallelLinear : public torch::autograd::Function<RowParallelLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle, c10::intrusive_ptr<GroupHandle> group,
                            bool sequence_parallel, bool overlap) {
    (void)weight_leaf;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["sp"] = sequence_parallel;
    ctx->saved_data["overlap"] = overlap;
    ctx->save_for_backward({x});
    const WeightUse w(*handle->params[0]);
    return row_parallel_product(x, w.get(), group->group, sequence_parallel, overlap);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    comm::Communicator& tp = group_of(ctx);
    Parameter& p = *handle->params[0];
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor grad_x;
    const at::Tensor go =
        ctx->saved_data["sp"].toBool()
            ? gather_output_grad(grads[0], tp, ctx->saved_data["overlap"].toBool(),
                                 ctx->needs_input_grad(0) ? &p : nullptr, &grad_x)
            : grads[0];
    if (ctx->needs_input_grad(0) && !grad_x.defined()) {
      const WeightUse w(p);
      grad_x = rows_of(go).mm(w.get());
    }
    if (grad_x.defined()) grad_x = grad_x.view(x.sizes());
    if (ctx->needs_input_grad(1))
      weight_gradient(handle->queue,
                      [g = rows_of(go), in = rows_of(x), &p] { accumulate_gradient_mm(p, g.t(), in); });
    return {grad_x, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct RecomputedLinear : public torch::autograd::Function<RecomputedLinear> {
  // `group` null: one rank (no reduction). The inputs reach apply as a TensorList (see recompute.cpp).
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<FunctionHolder> f, at::TensorList inputs,
                            const at::Tensor& weight_leaf, c10::intrusive_ptr<WeightHandle> handle,
                            c10::intrusive_ptr<GroupHandle> group, bool sequence_parallel, bool overlap) {
    (void)weight_leaf;
    ctx->saved_data["fn"] = c10::IValue::make_capsule(f);
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["sp"] = sequence_parallel;
    ctx->saved_data["overlap"] = overlap;
    ctx->save_for_backward(inputs.vec());
    const at::Tensor x = first_pass(f->fn, inputs.vec()).at(0);
    const WeightUse w(*handle->params[0]);
    return row_parallel_product(x, w.get(), group ? group->group : nullptr, sequence_parallel, overlap);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto f = c10::static_intrusive_pointer_cast<FunctionHolder>(ctx->saved_data["fn"].toCapsule());
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->params[0];
    const auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    // The order of the unrecomputed pair: o_proj's input and weight gradients, then the core's backward.
    Replayed again = replay(f->fn, saved);
    const at::Tensor x = again.outputs.at(0);
    at::Tensor grad_x;
    {
      // With sp the output gradient gathered over the whole sequence: gone before the core's backward
      // (unless a deferred weight gradient keeps it, as row_parallel_linear's would).
      const at::Tensor go =
          group && ctx->saved_data["sp"].toBool()
              ? gather_output_grad(grads[0], *group->group, ctx->saved_data["overlap"].toBool(),
                                   x.requires_grad() ? &p : nullptr, &grad_x)
              : grads[0];
      if (x.requires_grad() && !grad_x.defined()) {
        const WeightUse w(p);
        grad_x = rows_of(go).mm(w.get());
      }
      if (grad_x.defined()) grad_x = grad_x.view(x.sizes());
      if (ctx->needs_input_grad(saved.size()))  // the weight leaf follows the inputs among the tensors
        weight_gradient(handle->queue,
                        [g = rows_of(go), in = rows_of(x.detach()), &p] { accumulate_gradient_mm(p, g.t(), in); });
    }
    if (grad_x.defined()) torch::autograd::backward({x}, {grad_x});
    variable_list result = {at::Tensor()};  // none for the function
    for (const auto& input : again.inputs) result.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    for (int i = 0; i < 5; ++i) result.push_back(at::Tensor());  // weight leaf, handles, sp, overlap
    return result;
  }
};

// silu(gate) * up, by kernels/swiglu when `fused`.
at::Tensor swiglu_product(const at::Tensor& gate, const at::Tensor& up, bool use_fused) {
  return use_fused ? fused::swiglu_product(gate, up) : at::silu(gate) * up;
}

struct SwigluDownLinear : public torch::autograd::Function<SwigluDownLinear> {
  // `group` null: one rank (no reduction).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight_leaf, c10::intrusive_ptr<WeightHandle> handle,
                            c10::intrusive_ptr<GroupHandle> group, bool sequence_parallel, bool overlap, bool fused) {
    (void)weight_leaf;
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["sp"] = sequence_parallel;
    ctx->saved_data["overlap"] = overlap;
    ctx->saved_data["fused"] = fused;
    ctx->save_for_backward({gate, up});
    const WeightUse w(*handle->params[0]);
    const at::Tensor product = swiglu_product(gate, up, fused);
    return row_parallel_product(product, w.get(), group ? group->group : nullptr, sequence_parallel, overlap);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->params[0];
    const auto saved = ctx->get_saved_variables();
    const at::Tensor gate = saved[0], up = saved[1];
    const auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    const bool use_fused = ctx->saved_data["fused"].toBool();
    const bool input_grads = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    // With the overlapped gather (collective matmul) the product's gradient comes with the gather.
    const bool ring = group && ctx->saved_data["sp"].toBool() && ctx->saved_data["overlap"].toBool() && input_grads;
    at::Tensor grad_product;
    const at::Tensor go = group && ctx->saved_data["sp"].toBool()
                              ? gather_output_grad(grads[0], *group->group, ring, &p, &grad_product)
                              : grads[0];
    at::Tensor grad_gate, grad_up;
    auto input_gradients = [&] {
      if (!grad_product.defined()) {
        const WeightUse w(p);
        grad_product = rows_of(go).mm(w.get());
      }
      std::tie(grad_gate, grad_up) = use_fused ? fused::swiglu_backward(grad_product.view(gate.sizes()), gate, up)
                                               : swiglu_backward(grad_product.view(gate.sizes()), gate, up);
      grad_product = at::Tensor();
    };
    // The product's gradient from the ring is turned into gate and up gradients first, so that it
    // is gone before the weight gradient recomputes the product.
    if (ring) input_gradients();
    // Otherwise the weight gradient first (unless deferred): its recomputed product is freed before
    // the input gradient's temporaries exist. silu(gate) is computed for each use rather than held
    // across both (a [tokens, I] buffer at the backward's peak).
    if (ctx->needs_input_grad(2))
      weight_gradient(handle->queue, [g = rows_of(go), gate, up, use_fused, &p] {
        accumulate_gradient_mm(p, g.t(), rows_of(swiglu_product(gate, up, use_fused)));
      });
    if (input_grads && !ring) input_gradients();
    return {grad_gate, grad_up, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up) {
  // mul's backward (grad * other for each side), then silu's on the gate side.
  at::Tensor grad_up = grad * at::silu(gate);
  at::Tensor grad_gate = at::silu_backward(grad * up, gate);
  return {grad_gate, grad_up};
}

at::Tensor swiglu_down_linear(const at::Tensor& gate, const at::Tensor& up, Parameter& weight, WeightGradQueue* queue,
                              TpComm tp, bool fused) {
  return SwigluDownLinear::apply(gate, up, weight.tensor,
                                 c10::make_intrusive<WeightHandle>(std::vector<Parameter*>{&weight}, queue),
                                 tp.group ? c10::make_intrusive<GroupHandle>(tp.group) : c10::intrusive_ptr<GroupHandle>(),
                                 tp.sequence_parallel, tp.comm_overlap, fused);
}

at::Tensor recomputed_linear(TensorFunction f, const std::vector<at::Tensor>& inputs, Parameter& weight,
                             WeightGradQueue* queue, TpComm tp) {
  return RecomputedLinear::apply(c10::make_intrusive<FunctionHolder>(std::move(f)), at::TensorList(inputs), weight.tensor,
                                 c10::make_intrusive<WeightHandle>(std::vector<Parameter*>{&weight}, queue),
                                 tp.group ? c10::make_intrusive<GroupHandle>(tp.group) : c10::intrusive_ptr<GroupHandle>(),
                                 tp.sequence_parallel, tp.comm_overlap);
}

std::vector<at::Tensor> column_parallel_linear(const at::Tensor& x, const std::vector<Parameter*>& weights,
                                               WeightGradQueue* queue, TpComm tp,
                                               const std::function<at::Tensor()>& again) {
  std::vector<at::Tensor> leaves;
  for (Parameter* p : weights) leaves.push_back(p->tensor);
  return ColumnParallelLinear::apply(x, at::TensorList(leaves), c10::make_intrusive<WeightHandle>(weights, queue),
                                     c10::make_intrusive<GroupHandle>(tp.group), tp.sequence_parallel,
                                     tp.comm_overlap, detail::again_handle(again));
}

at::Tensor row_parallel_linear(const at::Tensor& x, Parameter& weight, WeightGradQueue* queue, TpComm tp) {
  return RowParallelLinear::apply(x, weight.tensor, c10::make_intrusive<WeightHandle>(std::vector<Parameter*>{&weight}, queue),
                                  c10::make_intrusive<GroupHandle>(tp.group), tp.sequence_parallel, tp.comm_overlap);
}

}  // namespace trainer::model
