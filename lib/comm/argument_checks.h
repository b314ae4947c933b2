#pragma once
// Checks of a collective's tensors before it starts, shared by every backend: with raw NCCL a
// wrong size is not an error but a write past a buffer, so sizes, split counts, dtypes and
// contiguity are checked here and a mismatch throws CommError naming the operation, the group and
// what was found. Gloo runs the same checks, so the CPU tests exercise them.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "comm/communicator.h"

namespace trainer::comm {

// `where`: "reduce_scatter on group dp (rank 1 of 4)".
void check_reduce_scatter(const std::string& where, int64_t group_size, const at::Tensor& output,
                          const at::Tensor& input);
void check_all_gather(const std::string& where, int64_t group_size, const at::Tensor& output, const at::Tensor& input);
void check_all_to_all(const std::string& where, int64_t group_size, const at::Tensor& output, const at::Tensor& input,
                      const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits);
void check_send_recv(const std::string& where, int64_t group_size, int64_t rank, const std::vector<P2POp>& ops);

}  // namespace trainer::comm
