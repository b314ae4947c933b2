#include <catch2/catch.hpp>

#include <stdexcept>

#include "data/window_order.h"

using trainer::data::permuted_window;

namespace {
std::vector<uint64_t> order(uint64_t count, uint64_t key) {
  std::vector<uint64_t> out;
  for (uint64_t p = 0; p < count; ++p) out.push_back(permuted_window(p, count, key));
  return out;
}

bool is_permutation(const std::vector<uint64_t>& values) {
  std::vector<bool> seen(values.size(), false);
  for (uint64_t v : values) {
    if (v >= values.size() || seen[v]) return false;
    seen[v] = true;
  }
  return true;
}
}  // namespace

TEST_CASE("data: each epoch's window order is a permutation: every window exactly once", "[data]") {
  for (uint64_t count : {1ULL, 2ULL, 3ULL, 4ULL, 5ULL, 15ULL, 16ULL, 17ULL, 100ULL, 1000ULL, 4097ULL, 65536ULL, 99991ULL}) {
    for (uint64_t key : {0ULL, 1ULL, 0xdeadbeefULL}) {
      INFO("count " << count << " key " << key);
      CHECK(is_permutation(order(count, key)));
    }
  }
}

TEST_CASE("data: the order depends on the key and on nothing else", "[data]") {
  CHECK(order(1000, 5) == order(1000, 5));
  CHECK(order(1000, 5) != order(1000, 6));
  // Shuffled, not shifted: few windows stay in place (about 1 expected) or keep their neighbour.
  const auto o = order(1000, 5);
  int fixed = 0, adjacent = 0;
  for (uint64_t p = 0; p < o.size(); ++p) {
    fixed += o[p] == p;
    if (p) adjacent += o[p] == o[p - 1] + 1;
  }
  CHECK(fixed < 10);
  CHECK(adjacent < 10);
}

TEST_CASE("data: huge window counts cost a few hashes per position", "[data]") {
  const uint64_t count = (1ULL << 40) + 3;
  for (uint64_t p : std::vector<uint64_t>{0, 1, count / 2, count - 1}) CHECK(permuted_window(p, count, 9) < count);
  CHECK(permuted_window(~0ULL - 1, ~0ULL, 9) < ~0ULL);
  CHECK_THROWS_AS(permuted_window(10, 10, 1), std::out_of_range);
}
