// Balanced packing (data.balance "cost"): equal counts per group, every sample exactly once, the
// contiguous split without balancing, the greedy's quality on long-tailed costs, determinism.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "data/batch_balance.h"

using namespace trainer;

TEST_CASE("balance: greedy longest-first with equal counts", "[data][balance]") {
  // Costs 9 7 6 5 4 1 into 2 groups of 3: 9 -> A, 7 -> B, 6 -> B (13), 5 -> A (14), 4 -> B (17), 1 -> A (15).
  const auto groups = data::balance_equal_groups({4, 9, 1, 7, 6, 5}, 2);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0] == std::vector<int64_t>{1, 2, 5});
  CHECK(groups[1] == std::vector<int64_t>{0, 3, 4});
  // A full group takes nothing more even when it has the least work: 10 10 1 1 into 2 groups of 2.
  const auto full = data::balance_equal_groups({10, 10, 1, 1}, 2);
  CHECK(full[0] == std::vector<int64_t>{0, 2});
  CHECK(full[1] == std::vector<int64_t>{1, 3});
  CHECK_THROWS_WITH(data::balance_equal_groups({1, 2, 3}, 2), Catch::Contains("3 items do not split into 2"));
}

TEST_CASE("balance: the global batch plan - contiguous without balancing - each sample once - near the mean with it",
          "[data][balance]") {
  const int64_t dp = 8, accumulation = 8, micro = 2, total = dp * accumulation * micro;
  // Costs of a long tail: sums of squared log-normal document lengths of 8192-token windows.
  std::mt19937_64 random(7);
  std::lognormal_distribution<double> length(std::log(600.0), 1.6);
  std::vector<double> costs;
  for (int64_t i = 0; i < total; ++i) {
    double left = 8192, squares = 0;
    while (left > 0) {
      const double l = std::min(left, std::max(1.0, std::round(length(random))));
      squares += l * l;
      left -= l;
    }
    costs.push_back(squares);
  }
  const auto contiguous = data::plan_global_batch(costs, dp, accumulation, micro, false);
  CHECK(contiguous[1][2] == std::vector<int64_t>{20, 21});  // (1 * 8 + 2) * 2
  const auto balanced = data::plan_global_batch(costs, dp, accumulation, micro, true);
  std::vector<int> seen(size_t(total), 0);
  for (const auto& rank : balanced) {
    REQUIRE(rank.size() == size_t(accumulation));
    for (const auto& m : rank) {
      REQUIRE(m.size() == size_t(micro));
      for (const int64_t i : m) ++seen[size_t(i)];
    }
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  const double before = data::max_over_mean(data::rank_loads(contiguous, costs));
  const double after = data::max_over_mean(data::rank_loads(balanced, costs));
  INFO("max/mean per-rank attention work: contiguous " << before << ", balanced " << after);
  CHECK(after < before);
  CHECK(after < 1.05);
  CHECK(data::plan_global_batch(costs, dp, accumulation, micro, true) == balanced);  // deterministic
  // Equal costs (no documents cut): the plan still holds every sample once.
  const auto equal = data::plan_global_batch(std::vector<double>(size_t(total), 1.0), dp, accumulation, micro, true);
  CHECK(data::max_over_mean(data::rank_loads(equal, std::vector<double>(size_t(total), 1.0))) == 1.0);
}
