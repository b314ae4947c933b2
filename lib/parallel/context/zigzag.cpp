#include "parallel/context/zigzag.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

namespace trainer::parallel {

namespace {
int64_t chunk_length(int64_t seq_len, int64_t cp) {
  if (cp < 1 || seq_len % (2 * cp) != 0)
    throw std::invalid_argument(
        fmt::format("context parallelism: a sequence of {} tokens does not split into 2 * cp = {} chunks", seq_len, 2 * cp));
  return seq_len / (2 * cp);
}
}  // namespace

at::Tensor zigzag_positions(int64_t seq_len, int64_t cp, int64_t rank, const at::TensorOptions& options) {
  const int64_t c = chunk_length(seq_len, cp);
  const auto o = options.dtype(at::kLong);
  return at::cat({at::arange(rank * c, (rank + 1) * c, o), at::arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, o)});
}

at::Tensor zigzag_take(const at::Tensor& x, int64_t dim, int64_t cp, int64_t rank) {
  if (cp == 1) return x;
  const int64_t c = chunk_length(x.size(dim), cp);
  return at::cat({x.narrow(dim, rank * c, c), x.narrow(dim, (2 * cp - 1 - rank) * c, c)}, dim);
}

at::Tensor zigzag_split(const at::Tensor& x, int64_t dim, int64_t cp) {
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < cp; ++r) parts.push_back(zigzag_take(x, dim, cp, r));
  return at::stack(parts);
}

at::Tensor zigzag_assemble(const at::Tensor& parts, int64_t dim) {
  const int64_t cp = parts.size(0);
  if (cp == 1) return parts[0];
  const int64_t c = parts.size(dim + 1) / 2;
  std::vector<at::Tensor> chunks(size_t(2 * cp));
  for (int64_t r = 0; r < cp; ++r) {
    chunks[size_t(r)] = parts[r].narrow(dim, 0, c);
    chunks[size_t(2 * cp - 1 - r)] = parts[r].narrow(dim, c, c);
  }
  return at::cat(chunks, dim);
}

}  // namespace trainer::parallel
