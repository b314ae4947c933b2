#include "model/expert_dispatcher.h"

#include <ATen/ATen.h>

#include <numeric>
#include <utility>

#include "parallel/expert/all_to_all.h"

namespace trainer::model {

namespace {

// Rows that arrived grouped by source s and then group g (counts[s][g] rows each, sources
// outermost): the order that groups them by g, sources in order within a group, and each group's
// row count.
std::pair<at::Tensor, std::vector<int64_t>> group_major(const std::vector<std::vector<int64_t>>& counts,
                                                        const at::Device& device) {
  const size_t sources = counts.size(), groups = counts.front().size();
  std::vector<int64_t> start(sources, 0), totals(groups, 0), order;
  for (size_t s = 1; s < sources; ++s)
    start[s] = start[s - 1] + std::accumulate(counts[s - 1].begin(), counts[s - 1].end(), int64_t(0));
  for (size_t g = 0; g < groups; ++g)
    for (size_t s = 0; s < sources; ++s) {
      int64_t offset = start[s];
      for (size_t m = 0; m < g; ++m) offset += counts[s][m];
      for (int64_t i = 0; i < counts[s][g]; ++i) order.push_back(offset + i);
      totals[g] += counts[s][g];
    }
  return {at::tensor(order, at::kLong).to(device), totals};
}

// Every rank's counts in `group`, in rank order. The exchange runs on `device` (NCCL takes
// device tensors only); the result comes to the host, which needs the split sizes.
std::vector<std::vector<int64_t>> exchange_counts(const std::vector<int64_t>& mine, comm::Communicator& group,
                                                  const at::Device& device) {
  at::Tensor input = at::tensor(mine, at::kLong).to(device);
  at::Tensor output = at::empty({group.size() * int64_t(mine.size())}, input.options());
  group.all_gather(output, input)->wait();
  output = output.cpu();
  std::vector<std::vector<int64_t>> all(size_t(group.size()));
  const int64_t* p = output.data_ptr<int64_t>();
  for (auto& row : all) {
    row.assign(p, p + mine.size());
    p += mine.size();
  }
  return all;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

}  // namespace

at::Tensor ExpertDispatcher::run(const GroupedExperts& experts, at::Tensor sorted, const std::vector<int64_t>& lengths,
                                 const std::function<void()>& meanwhile) const {
  if (ep_.size == 1) {
    meanwhile();
    return run_local(experts, std::move(sorted), lengths);
  }
  const int64_t local = num_experts_ / ep_.size;
  // Counts first: got[s][l] = copies rank s sends to local expert l.
  at::Tensor sent_counts = at::tensor(lengths, at::kLong).to(sorted.device());  // NCCL: device tensors
  at::Tensor received_counts = at::empty_like(sent_counts);
  const std::vector<int64_t> per_rank(size_t(ep_.size), local);
  ep_.group->all_to_all(received_counts, sent_counts, per_rank, per_rank)->wait();
  received_counts = received_counts.cpu();
  std::vector<std::vector<int64_t>> got(size_t(ep_.size));
  std::vector<int64_t> send_splits(size_t(ep_.size), 0), receive_splits(size_t(ep_.size), 0);
  for (int64_t r = 0; r < ep_.size; ++r) {
    const int64_t* row = received_counts.data_ptr<int64_t>() + r * local;
    got[size_t(r)].assign(row, row + local);
    receive_splits[size_t(r)] = sum(got[size_t(r)]);
    for (int64_t l = 0; l < local; ++l) send_splits[size_t(r)] += lengths[size_t(r * local + l)];
  }
  const auto device = sorted.device();
  parallel::RowsInFlight flight = parallel::start_all_to_all_rows(sorted, receive_splits, send_splits, *ep_.group);
  meanwhile();  // the shared experts, while the copies travel
  at::Tensor rows = flight.wait();
  sorted.reset();
  // Arrived in (source rank, local expert) order; the experts want (local expert, source rank).
  const auto [order, local_lengths] = group_major(got, device);
  rows = rows.index_select(0, order);
  at::Tensor y = run_local(experts, std::move(rows), local_lengths);
  // Back to arrival order, then home.
  y = y.index_select(0, at::argsort(order));
  return parallel::all_to_all_rows(y, send_splits, receive_splits, *ep_.group);
}

at::Tensor ExpertDispatcher::run_local(const GroupedExperts& experts, at::Tensor rows,
                                       const std::vector<int64_t>& lengths) const {
  const ExpertTensorParallel& etp = ep_.etp;
  if (etp.size == 1) return experts.forward(rows, lengths);
  // Every etp rank computes its slice of the experts' width for the rows of the whole etp group:
  // gather them (counts first), run, and send each rank the partial outputs of its own rows.
  const int64_t n = rows.size(0), hidden = rows.size(1);
  const auto theirs = exchange_counts(lengths, *etp.group, rows.device());
  std::vector<int64_t> their_rows;
  for (const auto& c : theirs) their_rows.push_back(sum(c));
  const std::vector<int64_t> mine(size_t(etp.size), n);
  const auto [order, per_expert] = group_major(theirs, rows.device());
  at::Tensor gathered = parallel::all_to_all_rows(rows.repeat({etp.size, 1}), their_rows, mine, *etp.group);
  rows.reset();
  gathered = gathered.index_select(0, order);
  at::Tensor partial = experts.forward(gathered, per_expert);
  gathered.reset();
  partial = partial.index_select(0, at::argsort(order));
  return parallel::all_to_all_rows(partial, mine, their_rows, *etp.group).view({etp.size, n, hidden}).sum(0);
}

}  // namespace trainer::model
