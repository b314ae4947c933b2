#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>

#include "data/mixture.h"

using trainer::data::Mixture;

namespace {
// Walks the first n samples, checking that each dataset's samples are numbered 0, 1, 2, ... in
// order (so the mixture is a bijection onto the datasets' own sample sequences) and that every
// prefix realises the weights within the documented (m - 1) / 2.
void check_mixture(const std::vector<double>& weights, uint64_t n) {
  const Mixture mixture(weights);
  const size_t m = weights.size();
  std::vector<uint64_t> counts(m, 0);
  double worst = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const auto slot = mixture.locate(i);
    REQUIRE(slot.dataset < m);
    REQUIRE(slot.local_index == counts[slot.dataset]);
    ++counts[slot.dataset];
    for (size_t j = 0; j < m; ++j)
      worst = std::max(worst, std::abs(double(counts[j]) - double(i + 1) * mixture.weights()[j]));
  }
  INFO("largest deviation from n * w_j over every prefix: " << worst << " samples");
  CHECK(worst <= (double(m) - 1) / 2 + 1e-6);
  // Stated tolerance on the proportions: 1e-4 absolute after 100k samples (actually <= m/2 samples).
  for (size_t j = 0; j < m; ++j) CHECK(double(counts[j]) / double(n) == Approx(mixture.weights()[j]).margin(1e-4));
}
}  // namespace

TEST_CASE("data: one dataset takes every sample in order", "[data]") {
  const Mixture mixture({3.0});
  for (uint64_t i : {0ULL, 1ULL, 12345ULL, ~0ULL}) {
    CHECK(mixture.locate(i).dataset == 0);
    CHECK(mixture.locate(i).local_index == i);
  }
}

TEST_CASE("data: mixing realises the weights for every prefix of the sample sequence", "[data]") {
  check_mixture({1, 1}, 100000);
  check_mixture({3, 1}, 100000);
  check_mixture({0.5, 0.3, 0.2}, 100000);
  check_mixture({0.01, 0.99}, 100000);
  check_mixture({1, 2, 3, 4, 5, 6, 7}, 100000);
  check_mixture({1e-3, 1, 1e6}, 100000);
}

TEST_CASE("data: mixing is exact far into training", "[data]") {
  // The number of samples dataset j took before sample i is within m of i * w_j, whatever i.
  const Mixture mixture({0.6, 0.3, 0.1});
  for (uint64_t i : {1ULL << 40, (1ULL << 50) + 17, 1ULL << 62}) {
    const auto slot = mixture.locate(i);
    CHECK(std::abs(double(slot.local_index) - double(i) * mixture.weights()[slot.dataset]) <
          1e-9 * double(i) + 3);
  }
}

TEST_CASE("data: the first samples interleave the datasets rather than running one after the other", "[data]") {
  const Mixture mixture({1, 1});
  std::vector<size_t> first;
  for (uint64_t i = 0; i < 6; ++i) first.push_back(mixture.locate(i).dataset);
  CHECK(first == std::vector<size_t>{0, 1, 0, 1, 0, 1});
}

TEST_CASE("data: weights must be positive", "[data]") {
  CHECK_THROWS_AS(Mixture({}), std::invalid_argument);
  CHECK_THROWS_AS(Mixture({1, 0}), std::invalid_argument);
  CHECK_THROWS_AS(Mixture({1, -2}), std::invalid_argument);
  CHECK_THROWS_AS(Mixture({1, std::nan("")}), std::invalid_argument);
}
