#include "model/aux_loss_scaler.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AuxLossScaler : public torch::autograd::Function<AuxLossScaler> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& output, const at::Tensor& aux_loss, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["aux_options"] = aux_loss.scalar_type();
    ctx->saved_data["aux_device"] = aux_loss.device();
    // A view would share the autograd history; the output is returned as is (no copy).
    return output.view_as(output);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto options = at::TensorOptions()
                             .dtype(ctx->saved_data["aux_options"].toScalarType())
                             .device(ctx->saved_data["aux_device"].toDevice());
    return {grads[0], at::full({}, scale, options), at::Tensor()};
  }
};

}  // namespace

at::Tensor attach_aux_loss(const at::Tensor& output, const at::Tensor& aux_loss, double scale) {
  if (!aux_loss.defined() || !aux_loss.requires_grad() || scale == 0) return output;
  return AuxLossScaler::apply(output, aux_loss, scale);
}

}  // namespace trainer::model
