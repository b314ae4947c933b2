#include "data/documents.h"

#include <stdexcept>

namespace trainer::data {

SampleDocuments sample_documents(const int32_t* tokens, int64_t count, const std::vector<int64_t>& starts,
                                 std::optional<int64_t> separator) {
  SampleDocuments out;
  out.document.resize(size_t(count));
  out.position.resize(size_t(count));
  int32_t document = 0, position = 0;
  size_t next = 0;  // the next entry of `starts`
  for (int64_t p = 0; p < count; ++p) {
    bool starts_here = false;
    if (separator) {
      starts_here = p > 0 && tokens[p - 1] == *separator;
    } else {
      while (next < starts.size() && starts[next] < p) ++next;  // a start at 0 is the sample's own
      starts_here = p > 0 && next < starts.size() && starts[next] == p;
    }
    if (starts_here) {
      ++document;
      position = 0;
    }
    out.document[size_t(p)] = document;
    out.position[size_t(p)] = position++;
  }
  return out;
}

}  // namespace trainer::data
