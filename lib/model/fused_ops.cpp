#include "model/fused_ops.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>

#include "cross_entropy.h"
#include "model/fused_kernels.h"
#include "rope.h"
#include "swiglu.h"

namespace trainer::model::fused {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::ElementType element_type(const at::Tensor& x, const char* what) {
  if (!fusable(x)) throw std::logic_error(std::string(what) + ": fused kernels take CUDA tensors of bf16 or fp32");
  return x.scalar_type() == at::kBFloat16 ? kernels::ElementType::BFloat16 : kernels::ElementType::Float32;
}

kernels::Stream stream_of(const at::Tensor& x) {
  return c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
}

// A [rows, cols] view of x's leading dimensions over its last, with the last contiguous (a copy
// only when no such view exists).
at::Tensor rows_view(const at::Tensor& x) {
  at::Tensor r = x.reshape({-1, x.size(-1)});
  return r.stride(1) == 1 ? r : r.contiguous();
}

struct FusedRmsNorm : public torch::autograd::Function<FusedRmsNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    auto [y, rstd] = at::_fused_rms_norm(x, {x.size(-1)}, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    auto [dx, dw] = at::_fused_rms_norm_backward(grads[0].contiguous(), x, {x.size(-1)}, rstd, weight,
                                                 {ctx->needs_input_grad(0), ctx->needs_input_grad(1)});
    return {dx, dw, at::Tensor()};
  }
};

// q and k rotated (forward) or their gradients rotated back (backward), in one launch.
std::pair<at::Tensor, at::Tensor> rotate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                         const at::Tensor& sin, bool backward) {
  const auto type = element_type(q, "rope");
  if (k.scalar_type() != q.scalar_type() || cos.scalar_type() != q.scalar_type() || sin.scalar_type() != q.scalar_type())
    throw std::logic_error("rope: q, k, cos and sin must share one dtype");
  const int64_t t = q.size(0), d = q.size(-1);
  if (q.dim() != 4 || k.dim() != 4 || k.size(0) != t || k.size(-1) != d || d % 2 != 0 || cos.numel() != t * d ||
      sin.numel() != t * d)
    throw std::logic_error("rope: q and k must be [T, B, heads, D] with D even and cos, sin [T, D]");
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor q3 = q.reshape({t, -1, d}), k3 = k.reshape({t, -1, d});
  const at::Tensor qi = q3.stride(2) == 1 ? q3 : q3.contiguous(), ki = k3.stride(2) == 1 ? k3 : k3.contiguous();
  const at::Tensor c = cos.contiguous(), s = sin.contiguous();
  at::Tensor qo = at::empty(q.sizes(), q.options()), ko = at::empty(k.sizes(), k.options());
  const kernels::RopeTensor qt{qi.data_ptr(), qo.data_ptr(), qi.size(1), qi.stride(0), qi.stride(1)};
  const kernels::RopeTensor kt{ki.data_ptr(), ko.data_ptr(), ki.size(1), ki.stride(0), ki.stride(1)};
  kernels::rope(qt, kt, c.data_ptr(), s.data_ptr(), t, d, backward, type, stream_of(q));
  return {qo, ko};
}

struct FusedRope : public torch::autograd::Function<FusedRope> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["q_sizes"] = q.sizes().vec();
    ctx->saved_data["k_sizes"] = k.sizes().vec();
    auto [qo, ko] = rotate(q, k, cos, sin, /*backward=*/false);
    return {qo, ko};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    // A gradient autograd left undefined (an output not used) is zero.
    const auto options = saved[0].options();
    const at::Tensor gq = grads[0].defined() ? grads[0] : at::zeros(ctx->saved_data["q_sizes"].toIntVector(), options);
    const at::Tensor gk = grads[1].defined() ? grads[1] : at::zeros(ctx->saved_data["k_sizes"].toIntVector(), options);
    auto [dq, dk] = rotate(gq, gk, saved[0], saved[1], /*backward=*/true);
    return {dq, dk, at::Tensor(), at::Tensor()};
  }
};

struct FusedSwiglu : public torch::autograd::Function<FusedSwiglu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swiglu_product(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    auto [dg, du] = swiglu_backward(grads[0], saved[0], saved[1]);
    return {dg, du};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  element_type(x, "rms_norm");
  return FusedRmsNorm::apply(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                       const at::Tensor& sin) {
  const auto out = FusedRope::apply(q, k, cos, sin);
  return {out[0], out[1]};
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return FusedSwiglu::apply(gate, up); }

at::Tensor swiglu_product(const at::Tensor& gate, const at::Tensor& up) {
  const auto type = element_type(gate, "swiglu");
  if (up.sizes() != gate.sizes() || up.scalar_type() != gate.scalar_type())
    throw std::logic_error("swiglu: gate and up must share shape and dtype");
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor g = rows_view(gate), u = rows_view(up);
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  kernels::swiglu_forward(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.size(0), g.size(1), g.stride(0), u.stride(0),
                          type, stream_of(gate));
  return out;
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up) {
  const auto type = element_type(gate, "swiglu");
  if (grad.sizes() != gate.sizes() || grad.scalar_type() != gate.scalar_type())
    throw std::logic_error("swiglu: the gradient must match gate's shape and dtype");
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor g = rows_view(gate), u = rows_view(up), dy = grad.contiguous();
  at::Tensor dg = at::empty(gate.sizes(), gate.options()), du = at::empty(gate.sizes(), gate.options());
  kernels::swiglu_backward(dy.data_ptr(), g.data_ptr(), u.data_ptr(), dg.data_ptr(), du.data_ptr(), g.size(0),
                           g.size(1), g.stride(0), u.stride(0), type, stream_of(gate));
  return {dg, du};
}

RowStats cross_entropy_row_stats(const at::Tensor& logits, const at::Tensor& column) {
  const auto type = element_type(logits, "cross_entropy_row_stats");
  if (logits.dim() != 2 || logits.stride(1) != 1 || column.scalar_type() != at::kLong || column.numel() != logits.size(0))
    throw std::logic_error("cross_entropy_row_stats: logits [rows, cols] with contiguous columns, column int64 [rows]");
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t rows = logits.size(0);
  const auto f32 = logits.options().dtype(at::kFloat);
  RowStats s{at::empty({rows}, f32), at::empty({rows}, f32), at::empty({rows}, f32)};
  const at::Tensor col = column.contiguous();
  kernels::cross_entropy_row_stats(logits.data_ptr(), rows, logits.size(1), logits.stride(0), col.data_ptr<int64_t>(),
                                   s.max.data_ptr<float>(), s.sum_exp.data_ptr<float>(),
                                   s.target_logit.data_ptr<float>(), type, stream_of(logits));
  return s;
}

void cross_entropy_logit_grad_(at::Tensor& logits, const at::Tensor& lse, const at::Tensor& column,
                               const at::Tensor& coef) {
  const auto type = element_type(logits, "cross_entropy_logit_grad_");
  const int64_t rows = logits.size(0);
  if (logits.dim() != 2 || logits.stride(1) != 1 || lse.scalar_type() != at::kFloat || coef.scalar_type() != at::kFloat ||
      column.scalar_type() != at::kLong || lse.numel() != rows || coef.numel() != rows || column.numel() != rows)
    throw std::logic_error("cross_entropy_logit_grad_: logits [rows, cols], lse and coef fp32 [rows], column int64 [rows]");
  const c10::cuda::CUDAGuard guard(logits.device());
  const at::Tensor l = lse.contiguous(), c = column.contiguous(), k = coef.contiguous();
  kernels::cross_entropy_logit_grad(logits.data_ptr(), logits.stride(0), logits.data_ptr(), logits.stride(0), rows,
                                    logits.size(1), l.data_ptr<float>(), c.data_ptr<int64_t>(), k.data_ptr<float>(),
                                    type, stream_of(logits));
}

void add_mm_(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (!out.is_cuda() || out.scalar_type() != at::kFloat || a.scalar_type() != at::kBFloat16 ||
      b.scalar_type() != at::kBFloat16)
    throw std::logic_error("add_mm_: out fp32 and a, b bf16, on CUDA");
  at::addmm_out(out, out, a, b, at::kFloat);
}

}  // namespace trainer::model::fused
