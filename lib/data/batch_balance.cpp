#include "data/batch_balance.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace trainer::data {

std::vector<std::vector<int64_t>> balance_equal_groups(const std::vector<double>& costs, int64_t groups) {
  const int64_t n = int64_t(costs.size());
  if (groups < 1 || n % groups != 0)
    throw std::invalid_argument(fmt::format("balance: {} items do not split into {} equal groups", n, groups));
  const int64_t room = n / groups;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return costs[size_t(a)] > costs[size_t(b)]; });
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(groups));
  std::vector<double> load(static_cast<size_t>(groups), 0.0);
  for (const int64_t item : order) {
    size_t best = size_t(groups);
    for (size_t g = 0; g < size_t(groups); ++g)
      if (int64_t(members[g].size()) < room && (best == size_t(groups) || load[g] < load[best])) best = g;
    members[best].push_back(item);
    load[best] += costs[size_t(item)];
  }
  for (auto& m : members) std::sort(m.begin(), m.end());
  return members;
}

GlobalBatchPlan plan_global_batch(const std::vector<double>& costs, int64_t dp, int64_t accumulation,
                                  int64_t micro_batch_size, bool balance) {
  const int64_t total = dp * accumulation * micro_batch_size;
  if (int64_t(costs.size()) != total)
    throw std::invalid_argument(fmt::format("balance: {} sample costs for a global batch of {} samples", costs.size(), total));
  GlobalBatchPlan plan(static_cast<size_t>(dp), std::vector<std::vector<int64_t>>(static_cast<size_t>(accumulation)));
  if (!balance) {
    for (int64_t r = 0; r < dp; ++r)
      for (int64_t m = 0; m < accumulation; ++m)
        for (int64_t i = 0; i < micro_batch_size; ++i)
          plan[size_t(r)][size_t(m)].push_back((r * accumulation + m) * micro_batch_size + i);
    return plan;
  }
  // Micro-batches first, from the whole global batch: their composition is then the same on
  // every mesh (a MoE layer's micro-batch auxiliary loss and its capacity drops see the same
  // tokens together as in one process), and only which rank runs which depends on dp.
  const int64_t micro_batches = dp * accumulation;
  const auto micro = balance_equal_groups(costs, micro_batches);
  std::vector<double> micro_costs;
  for (const auto& m : micro) {
    double sum = 0;
    for (const int64_t i : m) sum += costs[size_t(i)];
    micro_costs.push_back(sum);
  }
  const auto ranks = balance_equal_groups(micro_costs, dp);
  for (int64_t r = 0; r < dp; ++r)
    for (int64_t m = 0; m < accumulation; ++m) plan[size_t(r)][size_t(m)] = micro[size_t(ranks[size_t(r)][size_t(m)])];
  return plan;
}

std::vector<double> rank_loads(const GlobalBatchPlan& plan, const std::vector<double>& costs) {
  std::vector<double> loads;
  for (const auto& rank : plan) {
    double sum = 0;
    for (const auto& micro : rank)
      for (const int64_t i : micro) sum += costs[size_t(i)];
    loads.push_back(sum);
  }
  return loads;
}

double max_over_mean(const std::vector<double>& loads) {
  if (loads.empty()) return 1.0;
  const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / double(loads.size());
  return mean > 0 ? *std::max_element(loads.begin(), loads.end()) / mean : 1.0;
}

}  // namespace trainer::data
