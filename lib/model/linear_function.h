#pragma once
// The one linear (and embedding) every layer is written on (DESIGN.md invariant 8): custom
// autograd functions whose weight gradient does not go through autograd's accumulation but into
// the parameter's gradient (model::accumulate_gradient: the fp32 main_grad when gradient buffers
// are installed), so that
//   - the weight-gradient computation can be deferred (zero-bubble's W, model::WeightGradQueue);
//   - the weight can come from a gather just before use and be released after (ZeRO-3,
//     Parameter::gather/release), in forward and again in backward: only the input is saved;
//   - bf16 runs accumulate weight gradients across micro-batches in fp32.
// The arithmetic is the same as at::linear's (x folded to 2-D, one mm per gradient), so an fp32
// model computes bit-identical results.
#include <ATen/core/Tensor.h>

#include <functional>

#include "model/parameter.h"
#include "model/weight_grad_queue.h"

namespace trainer::model {

// y = x W^T for x [..., in] and W = weight's local tensor [out, in]. With `again` the input is not
// saved: backward calls it to compute the input again (a norm's output, recomputed).
at::Tensor linear(const at::Tensor& x, Parameter& weight, WeightGradQueue* queue,
                  const std::function<at::Tensor()>& again = {});

// Rows of weight [vocab, hidden] for int64 token ids of any shape.
at::Tensor embedding(const at::Tensor& tokens, Parameter& weight, WeightGradQueue* queue);

}  // namespace trainer::model
