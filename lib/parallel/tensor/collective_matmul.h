#pragma once
// Collective matmul: the sequence-parallel all-gather before a GEMM and the reduce-scatter after
// one, decomposed into a ring of tp - 1 send/recv steps pipelined with the GEMM's row chunks, so
// that each step's transfer runs while the previous chunk is multiplied (Wang et al., "Overlap
// communication with dependent computation via decomposition", ASPLOS 2023; Megatron's
// tp_comm_overlap ring exchange). Only the part of each step's transfer longer than one chunk's
// GEMMs is exposed. The rows of the sequence chunk that rank j holds are rows [j S, (j + 1) S) of
// the gathered tensor, as the all-gather along dimension 0 orders them.
//
// Results: every output row is one row of the input times the right-hand side, as in one GEMM
// over all rows (the same kernel over fewer rows: bit-identical where the BLAS does not change
// its reduction order with the row count, which the tests check on the CPU). The reduce-scatter
// sums each chunk's tp partial products in ring order, from rank d + 1 round to d: with tp 2 one
// addition, so bit-identical to any reduction; with more ranks another summation order than the
// backend's, within fp32 rounding.
#include <ATen/core/Tensor.h>

#include <vector>

#include "comm/communicator.h"

namespace trainer::parallel {

// out_i = all_gather(x) @ rhs_i, for x [S, ..., k] this rank's chunk of the sequence and each
// rhs_i [k, n_i]: returns out_i [tp * S, ..., n_i]. With `gathered`, the gathered input
// [tp * S, ..., k] is assembled there as it travels (for a weight gradient that needs it whole).
std::vector<at::Tensor> all_gather_matmul(const at::Tensor& x, const std::vector<at::Tensor>& rhs, comm::Communicator& tp,
                                          at::Tensor* gathered = nullptr);

// reduce_scatter(x @ rhs) along dimension 0, for x [tp * S, ..., k] (this rank's partial
// products' input: the row-parallel linear's) and rhs [k, n]: this rank's [S, ..., n] of the sum
// over tp of every rank's x @ rhs.
at::Tensor matmul_reduce_scatter(const at::Tensor& x, const at::Tensor& rhs, comm::Communicator& tp);

}  // namespace trainer::parallel
