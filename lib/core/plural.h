#pragma once
// "1 micro-batch", "4 micro-batches": a count with its noun in the right number.
#include <cstdint>
#include <string>

namespace trainer {

inline std::string count_of(int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace trainer
