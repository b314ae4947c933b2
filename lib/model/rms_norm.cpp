#include "model/rms_norm.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/csrc/autograd/custom_function.h>

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    const at::Tensor x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
    const at::Tensor rstd = at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
    ctx->save_for_backward({x, weight, rstd});
    return weight * (x32 * rstd).to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const at::Tensor& grad = grads[0];
    // xhat = x32 * rstd, the normalised values (in fp32), computed again.
    const at::Tensor xhat = x.to(rstd.scalar_type()) * rstd;
    // y = weight * xhat.to(dtype): the weight's gradient summed over the rows.
    at::Tensor grad_weight;
    if (ctx->needs_input_grad(1)) grad_weight = at::sum_to(grad * xhat.to(x.scalar_type()), weight.sizes());
    at::Tensor grad_x;
    if (ctx->needs_input_grad(0)) {
      // d xhat = (grad * weight) in fp32; dx = rstd (d xhat - xhat mean(d xhat * xhat)).
      at::Tensor g = (grad * weight).to(rstd.scalar_type());
      const at::Tensor c = (g * xhat).mean(-1, /*keepdim=*/true);
      g.sub_(xhat * c).mul_(rstd);
      grad_x = g.to(x.scalar_type());
    }
    return {grad_x, grad_weight, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace trainer::model
