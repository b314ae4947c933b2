#pragma once
// Counter-based randomness: every random number is a hash of the coordinates it belongs to
// (seed, sample index, position, ...), never the next value of a stream. That is what lets any
// sample be computed alone, on any rank, in any order, and still be the same.
#include <cstdint>

namespace trainer::data {

// The splitmix64 finaliser: a bijection on 64-bit words whose output bits all depend on all input bits.
constexpr uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A well-mixed hash of several words; distinct tuples give independent-looking results.
constexpr uint64_t hash_words(uint64_t a, uint64_t b) { return mix64(mix64(a) ^ b); }
constexpr uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c) { return mix64(hash_words(a, b) ^ c); }
constexpr uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return mix64(hash_words(a, b, c) ^ d);
}

// A value in [0, n) from a uniform 64-bit hash (multiply-shift; the bias is below n / 2^64).
constexpr uint64_t below(uint64_t hash, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * n) >> 64);
}

}  // namespace trainer::data
