#include "checkpoint/shard_assignment.h"

#include <algorithm>
#include <map>
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

std::vector<TensorRecord> records_to_write(std::vector<TensorRecord> records) {
  std::map<std::string, std::vector<size_t>> by_group;
  for (size_t i = 0; i < records.size(); ++i)
    if (records[i].replicated) by_group[records[i].replicated->group].push_back(i);
  std::vector<bool> keep(records.size(), true);
  for (const auto& [group, members] : by_group) {
    std::vector<uint64_t> bytes;
    for (size_t i : members) bytes.push_back(records[i].tensor.nbytes());
    const TensorRecord::Replication& r = *records[members.front()].replicated;
    const std::vector<int64_t> owner = assign_replicated(bytes, r.count);
    for (size_t k = 0; k < members.size(); ++k) keep[members[k]] = owner[k] == r.position;
  }
  std::vector<TensorRecord> mine;
  for (size_t i = 0; i < records.size(); ++i)
    if (keep[i]) mine.push_back(std::move(records[i]));
  return mine;
}

}  // namespace trainer::checkpoint
