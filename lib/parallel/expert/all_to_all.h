#pragma once
// The token exchange of expert parallelism as an autograd function: rows of `x` go to the ranks of
// the expert-parallel group in uneven blocks (all_to_all of the communicator), and the gradient
// comes back the opposite way (the same exchange with the splits swapped).
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace trainer::parallel {

// x: [sum(send_splits), ...]; rows [sum(send_splits[:j]), +send_splits[j]) go to rank j. Returns
// [sum(receive_splits), ...]: the rows from rank j at [sum(receive_splits[:j]), +receive_splits[j]).
at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& receive_splits,
                           const std::vector<int64_t>& send_splits, comm::Communicator& group);

// The same exchange, started and left in flight so that other work (shared experts) overlaps
// it: `rows` may be read (or used in any computation) only after wait(). Backward is synchronous.
class RowsInFlight {
 public:
  struct State;
  RowsInFlight(at::Tensor rows, std::shared_ptr<State> state) : rows_(std::move(rows)), state_(std::move(state)) {}
  // Waits for the exchange and hands over the received rows (once).
  at::Tensor wait();

 private:
  at::Tensor rows_;
  std::shared_ptr<State> state_;
};
RowsInFlight start_all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& receive_splits,
                                   const std::vector<int64_t>& send_splits, comm::Communicator& group);

}  // namespace trainer::parallel
