#pragma once
// The order in which one epoch visits a dataset's windows: a pseudo-random permutation of
// [0, count), computed one position at a time, so nothing proportional to the dataset is ever
// stored and any position of any epoch costs the same few hashes.
#include <cstdint>

namespace trainer::data {

// The window visited at `position` (< count) of the permutation keyed by `key`. For a fixed
// (count, key) this is a bijection on [0, count); different keys give unrelated orders.
// A balanced Feistel network over the smallest even number of bits that covers count, with
// cycle walking: re-encrypt while the result is >= count (fewer than 4 rounds on average,
// because the covering domain is less than 4 x count).
uint64_t permuted_window(uint64_t position, uint64_t count, uint64_t key);

}  // namespace trainer::data
