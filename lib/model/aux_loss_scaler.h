#pragma once
// Megatron's MoEAuxLossAutoScaler: a load-balancing loss enters backward through the layer's
// output instead of being added to the model's loss, so it works on any pipeline stage (a middle
// stage has no loss of its own). Forward returns `output` unchanged; backward passes the output's
// gradient through and gives `aux_loss` the gradient `scale` (its weight in the step's loss).
#include <ATen/core/Tensor.h>

namespace trainer::model {

at::Tensor attach_aux_loss(const at::Tensor& output, const at::Tensor& aux_loss, double scale);

}  // namespace trainer::model
