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

SampleDocuments documents_of_sample(const Dataset& dataset, uint64_t index, int64_t seq_len,
                                    std::optional<int64_t> separator, std::vector<int32_t>* tokens) {
  std::vector<int32_t> own;
  std::vector<int32_t>& sample = tokens ? *tokens : own;
  sample.resize(size_t(seq_len + 1));
  dataset.sample(index, seq_len, sample.data());
  std::vector<int64_t> starts;
  if (!separator) {
    auto found = dataset.document_starts(index, seq_len);
    if (!found) throw std::logic_error("document masking without a separator token needs a document index");
    starts = std::move(*found);
  }
  return sample_documents(sample.data(), seq_len + 1, starts, separator);
}

int64_t squared_document_lengths(const SampleDocuments& documents, int64_t count) {
  int64_t sum = 0, length = 0;
  for (int64_t p = 0; p < count; ++p) {
    if (p > 0 && documents.document[size_t(p)] != documents.document[size_t(p - 1)]) {
      sum += length * length;
      length = 0;
    }
    ++length;
  }
  return sum + length * length;
}

}  // namespace trainer::data
