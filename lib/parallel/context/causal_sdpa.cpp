#include "parallel/context/causal_sdpa.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GradInLayout : public torch::autograd::Function<GradInLayout> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["strides"] = x.strides().vec();
    return x.alias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const auto strides = ctx->saved_data["strides"].toIntVector();
    if (!g.defined() || g.strides() == at::IntArrayRef(strides)) return {g};
    at::Tensor out = at::empty_strided(ctx->saved_data["sizes"].toIntVector(), strides, g.options());
    out.copy_(g);
    return {out};
  }
};

}  // namespace

at::Tensor grad_in_layout_of(const at::Tensor& x) {
  // Only a dense, non-overlapping layout can be allocated again as it is.
  if (!x.requires_grad() || !x.is_non_overlapping_and_dense()) return x;
  return GradInLayout::apply(x);
}

at::Tensor causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::Tensor out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                                          /*enable_gqa=*/q.size(1) != k.size(1));
  // On CUDA only: the kernels concerned are there, and CPU runs stay as they were.
  return out.is_cuda() ? grad_in_layout_of(out) : out;
}

}  // namespace trainer::parallel
