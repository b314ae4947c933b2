#include "data/window_order.h"

#include <bit>
#include <stdexcept>

#include "data/counter_rng.h"

namespace trainer::data {

namespace {
// Six rounds of a Feistel network with a strong round function are far more than a training
// data order needs to look random; each round is one hash.
constexpr int kRounds = 6;

uint64_t feistel(uint64_t x, int half_bits, uint64_t key) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = x >> half_bits, right = x & mask;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t next = left ^ (hash_words(key, static_cast<uint64_t>(round), right) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}
}  // namespace

uint64_t permuted_window(uint64_t position, uint64_t count, uint64_t key) {
  if (position >= count) throw std::out_of_range("permuted_window: position outside [0, count)");
  if (count == 1) return 0;
  // Halves of h bits cover [0, 4^h); with h = ceil(bits(count - 1) / 2) >= 1, 4^h < 4 * count.
  const int bits = std::bit_width(count - 1);
  const int half_bits = (bits + 1) / 2;
  uint64_t x = position;
  do {
    x = feistel(x, half_bits, key);
  } while (x >= count);
  return x;
}

}  // namespace trainer::data
