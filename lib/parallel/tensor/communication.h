#pragma once
// The conjugate communication operators of Megatron's tensor parallelism as autograd functions
// over the tensor-parallel group (DESIGN.md section 6). Each is the identity for a group of one.
//   copy_to_tp         f: forward identity,            backward all-reduce
//   reduce_from_tp     g: forward all-reduce,          backward identity
// With sequence parallelism the activations between blocks are split along the sequence, which
// is dimension 0 of the [s, b, h] layout, so every piece is a contiguous chunk (no copies):
//   gather_from_sp        forward all-gather (dim 0),     backward reduce-scatter
//   reduce_scatter_to_sp  forward reduce-scatter (dim 0), backward all-gather
//   scatter_to_sp         forward this rank's chunk,      backward all-gather
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace trainer::parallel {

at::Tensor copy_to_tp(const at::Tensor& x, comm::Communicator& tp);
at::Tensor reduce_from_tp(const at::Tensor& x, comm::Communicator& tp);
at::Tensor gather_from_sp(const at::Tensor& x, comm::Communicator& tp);
at::Tensor reduce_scatter_to_sp(const at::Tensor& x, comm::Communicator& tp);
at::Tensor scatter_to_sp(const at::Tensor& x, comm::Communicator& tp);

}  // namespace trainer::parallel
