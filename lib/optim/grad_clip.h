#pragma once
// The global gradient norm and clipping by it, over whole local parameters.
#include <ATen/core/Tensor.h>

#include <deque>

#include "model/parameter.h"

namespace trainer::optim {

// The L2 norm of all gradients together (fp32), as a scalar tensor. Parameters without a gradient
// count as zero.
at::Tensor global_grad_norm(const std::deque<model::Parameter>& params);

// The factor that brings a gradient norm down to max_norm: 1 when max_norm <= 0 (no clipping) or
// the norm is already below it.
double clip_coefficient(double max_norm, double norm);

// Scales gradients by clip_coefficient(max_norm, norm). Returns the coefficient applied.
double clip_gradients(std::deque<model::Parameter>& params, double max_norm, double norm);

}  // namespace trainer::optim
