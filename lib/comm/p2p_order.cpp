#include <fmt/format.h>

#include <algorithm>

#include "comm/communicator.h"

namespace trainer::comm {

std::vector<P2POp> in_matching_order(const std::vector<P2POp>& ops) {
  for (const auto& op : ops)
    if (op.tag < 0 || op.tag > int64_t(0x7fffffff))
      throw CommError(fmt::format("send/recv: tag {} is outside 0..2147483647", op.tag));
  std::vector<P2POp> sorted = ops;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const P2POp& a, const P2POp& b) { return a.peer != b.peer ? a.peer < b.peer : a.tag < b.tag; });
  return sorted;
}

}  // namespace trainer::comm
