#pragma once
// Megatron's column- and row-parallel linears, each one autograd function that carries its own
// tensor-parallel communication (DESIGN.md section 6), so that backward can overlap it with
// computation (Megatron's default on GPU; on Gloo the collective runs on Gloo's threads):
//   - column-parallel backward starts the input-gradient all-reduce (reduce-scatter with sequence
//     parallelism) and computes the weight gradients while it runs;
//   - with sequence parallelism the column-parallel input is saved as this rank's sequence chunk
//     and all-gathered again in backward (overlapped with the input-gradient GEMMs), never saved
//     gathered (Korthikanti et al.);
//   - with sequence parallelism and TpComm::comm_overlap the forward's gather and reduce-scatter
//     and the row-parallel backward's gather are collective matmuls: each chunk of the sequence is
//     multiplied while the next one travels around the tp ring.
// The weights are the custom linear's (model/linear_function.h): gathered per use, weight
// gradients added into the parameter's gradient or queued while the queue defers them (then the
// collective is simply waited for). Activations are [s, b, h]: the sequence is dimension 0, so
// every sequence chunk is contiguous and no boundary needs a transpose.
#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/parameter.h"
#include "model/recompute.h"
#include "model/weight_grad_queue.h"

namespace trainer::model {

struct TpComm {
  comm::Communicator* group = nullptr;  // the tp group (size > 1)
  bool sequence_parallel = false;
  // With sequence parallelism: the forward's all-gather before a column-parallel GEMM and
  // reduce-scatter after a row-parallel one, and the row-parallel backward's gather of the output
  // gradient, run as rings pipelined with the GEMM's chunks (parallel/tensor/collective_matmul.h;
  // parallel.tp_comm_overlap).
  bool comm_overlap = true;
};

// Column-parallel linears that read one input (q/k/v, gate/up, the LM head alone): returns
// y_i = x W_i^T for each W_i, this rank's rows [out_i / tp, in] of the global weight. x is
// replicated over tp ([s, b, in]; its gradient is all-reduced) or, with sequence parallelism, this
// rank's chunk [s / tp, b, in] of the sequence (all-gathered; its gradient reduce-scattered).
// With `again` the input (the chunk with sp) is not saved: backward calls it to compute it again.
std::vector<at::Tensor> column_parallel_linear(const at::Tensor& x, const std::vector<Parameter*>& weights,
                                               WeightGradQueue* queue, TpComm tp,
                                               const std::function<at::Tensor()>& again = {});

// y = x W^T for W this rank's columns [out, in / tp] and x [s, b, in / tp]: the partial products
// are summed over tp, all-reduced ([s, b, out] on every rank) or, with sequence parallelism,
// reduce-scattered along the sequence ([s / tp, b, out]; the gradient is all-gathered in backward).
at::Tensor row_parallel_linear(const at::Tensor& x, Parameter& weight, WeightGradQueue* queue, TpComm tp);

// y = f(inputs) W^T where f's output, the linear's input, is kept by nobody: f runs without autograd
// in forward and again with autograd in backward, where its output serves both the weight
// gradient and f's own backward (model/recompute.h's passes). Only `inputs` are saved. Selective
// recomputation of the attention core: the core's output is o_proj's input, so no attention
// output is held between forward and backward, and the core still runs only once in backward.
// Row-parallel like row_parallel_linear when tp.group is set; one rank otherwise (the arithmetic
// of model::linear). f returns one tensor [..., in] (in: the weight's local columns).
at::Tensor recomputed_linear(TensorFunction f, const std::vector<at::Tensor>& inputs, Parameter& weight,
                             WeightGradQueue* queue, TpComm tp);

// The SwiGLU MLP's second half, down(silu(gate) * up), as one function that saves only gate and
// up: the product is recomputed in backward (for the weight gradient) instead of kept from
// forward. Row-parallel like row_parallel_linear when tp.group is set (sizes as there, gate and
// up [s, b, I / tp]); one rank otherwise. Values and gradients equal the unfused autograd graph's
// bit for bit (the same kernels in the same order), unless `fused`: the product and its backward by
// kernels/swiglu (fusable tensors only; model/fused_kernels.h), one rounding per element.
at::Tensor swiglu_down_linear(const at::Tensor& gate, const at::Tensor& up, Parameter& weight, WeightGradQueue* queue,
                              TpComm tp, bool fused = false);

// The gradients of silu(gate) * up for the product's gradient `grad` (as autograd computes them):
// {d gate, d up}.
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up);

}  // namespace trainer::model
