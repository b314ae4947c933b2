#include "data/token_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::data {

std::vector<uint64_t> TokenSource::document_starts(uint64_t, uint64_t) const {
  throw std::logic_error(fmt::format("{} ({} format) has no document index", name(), format()));
}

std::vector<uint64_t> starts_within(const uint64_t* starts, size_t n, uint64_t begin, uint64_t count) {
  const uint64_t* first = std::lower_bound(starts, starts + n, begin);
  const uint64_t* last = std::lower_bound(first, starts + n, begin + count);
  std::vector<uint64_t> out;
  // Empty documents repeat an offset: one start per offset.
  for (const uint64_t* p = first; p != last; ++p)
    if (out.empty() || out.back() != *p) out.push_back(*p);
  return out;
}

}  // namespace trainer::data
