#pragma once
// The replay of linear layers and tensor-parallel boundaries (parallel_linear.cpp,
// linear_function.cpp): weight and input gradients, the column-parallel backward with its
// reduction behind the weight-gradient GEMMs, the gathers and reductions around a tp block.
// Torch-free: the estimator composes it (lib/estimate), and it sits beside the code it replays so
// that a change to one is made to both. Each forward function returns what its backward needs
// (what autograd saved); backward functions consume the incoming gradient and return the outgoing
// one. Checked against the byte-counting CPU allocator (test/e2e/test_estimate.cpp).
#include <cstdint>
#include <vector>

#include "counting/replay.h"

namespace trainer::model::replays {

using namespace trainer::counting;  // Replay, Id, Timeline, CommKind, ...

// --- linear layers: save the input, produce weight and input gradients ----------------------
// Backward of y = x W^T (W [n,k], x [m,k]): the weight gradient is a new tensor accumulated
// into the persistent .grad (AccumulateGrad adds in place, then frees it); the input gradient
// is new. `saved` is the input the linear holds, released after.
Id linear_backward(Replay& r, Id g, int64_t m, int64_t n, int64_t k, Id saved, bool drop_grad = true);

// A weight gradient dW [n, k] = g^T [n, m] x [m, k] added into the parameter's gradient: a new
// tensor added in (AccumulateGrad / accumulate_gradient), or, with the fused gradient
// accumulation of a bf16 model, the GEMM itself adding into the fp32 main_grad (no temporary).
void weight_grad(Replay& r, int64_t n, int64_t k, int64_t m);

// Backward of column_parallel_linear (parallel_linear.cpp): outputs of `widths` columns from
// one input [rows, H] it saved once (`saved`; with `regather`, the sequence shard, all-gathered
// again behind the input-gradient GEMMs). With `reduce` the summed input gradient is all-reduced
// (reduce-scattered with sp) over tp behind the weight-gradient GEMMs. Consumes the output
// gradients `gs`; returns the input gradient ([Tn, H] when reduce-scattered).
Id column_backward(Replay& r, const std::vector<Id>& gs, const std::vector<int64_t>& widths, Id saved, int64_t rows,
                   bool regather, bool reduce);

// --- tensor-parallel boundaries -------------------------------------------------------------
// Input of a column-parallel block: with sp, all-gather the norm output (the gathered copy is
// not saved: backward gathers again, as Megatron does); with tp only, the input is replicated.
// `gemms` > 0: the input of that many column-parallel linears that read it together (q/k/v,
// gate/up); with the collective matmul (Replay::tp_ring) no gathered copy exists, only the chunks
// in flight (one; two from tp 3), and the next `gemms` GEMMs run chunk by chunk behind the ring's
// steps. 0: gathered whole (the LM head's gather_from_sp).
Id gather_input(Replay& r, Id x, int gemms = 0);

// A row-parallel linear's output, y = x W^T [rows, n] for x [rows, k], summed over tp: one GEMM
// and an all-reduce (tp) or reduce-scatter (sp) of its partial sums or, with the collective matmul, tp chunk GEMMs pipelined with the
// ring's steps, at most three chunks [rows / tp, n] alive (the running sum, the one arriving, the
// next partial product) and never the whole product.
Id row_output(Replay& r, int64_t rows, int64_t n, int64_t k);

// Backward of gather_input: the input gradient is summed (sp: reduce-scattered) across tp.
Id reduce_grad(Replay& r, Id g);

// With sp the row-parallel output's gradient is all-gathered into a new buffer; otherwise the
// residual gradient itself feeds the projection. With the collective matmul the next GEMM
// recorded (the input gradient g W) runs chunk by chunk behind the gather's ring steps.
Id gather_grad_copy(Replay& r, Id g);

}  // namespace trainer::model::replays
