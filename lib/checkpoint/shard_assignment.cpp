#include "checkpoint/shard_assignment.h"

#include <algorithm>
#include <numeric>

namespace trainer::checkpoint {

std::vector<int64_t> assign_replicated(const std::vector<uint64_t>& bytes, int64_t ranks) {
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<uint64_t> load(size_t(std::max<int64_t>(ranks, 1)), 0);
  std::vector<int64_t> owner(bytes.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    owner[i] = least - load.begin();
    *least += bytes[i];
  }
  return owner;
}

std::vector<TensorRecord> records_to_write(std::vector<TensorRecord> records, int64_t dp_rank, int64_t dp_size) {
  std::vector<uint64_t> bytes;
  for (const auto& r : records)
    if (r.replicated) bytes.push_back(r.tensor.nbytes());
  const std::vector<int64_t> owner = assign_replicated(bytes, dp_size);
  std::vector<TensorRecord> mine;
  size_t next = 0;
  for (auto& r : records)
    if (!r.replicated || owner[next++] == dp_rank) mine.push_back(std::move(r));
  return mine;
}

}  // namespace trainer::checkpoint
