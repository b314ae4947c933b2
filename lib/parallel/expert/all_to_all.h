#pragma once
// The token exchange of expert parallelism as an autograd function: rows of `x` go to the ranks of
// the expert-parallel group in uneven blocks (all_to_all of the communicator), and the gradient
// comes back the opposite way (the same exchange with the splits swapped).
#include <ATen/core/Tensor.h>

#include <vector>

#include "comm/communicator.h"

namespace trainer::parallel {

// x: [sum(send_splits), ...]; rows [sum(send_splits[:j]), +send_splits[j]) go to rank j. Returns
// [sum(receive_splits), ...]: the rows from rank j at [sum(receive_splits[:j]), +receive_splits[j]).
at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& receive_splits,
                           const std::vector<int64_t>& send_splits, comm::Communicator& group);

}  // namespace trainer::parallel
