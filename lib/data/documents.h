#pragma once
// Documents inside one sample (data.document_masking): which document each token belongs to and
// its position within it. A sample's seq_len + 1 tokens are cut where a document starts: at the
// dataset's document index (Dataset::document_starts), or after each separator token
// (data.document_separator_token: the separator ends its document, as an end-of-text token).
// Torch-free.
#include <cstdint>
#include <optional>
#include <vector>

#include "data/dataset.h"

namespace trainer::data {

struct SampleDocuments {
  std::vector<int32_t> document;  // per token: 0 for the sample's first document, then +1 at each start
  std::vector<int32_t> position;  // per token: its offset from its document's first token in the sample
};

// tokens: the sample's `count` tokens. With `separator` the starts are the tokens after each
// separator (a separator at the last token starts nothing here); otherwise `starts` (positions
// in 1..count-1, increasing, as Dataset::document_starts gives them).
SampleDocuments sample_documents(const int32_t* tokens, int64_t count, const std::vector<int64_t>& starts,
                                 std::optional<int64_t> separator);

// The documents of global sample `index` of `dataset` (seq_len + 1 tokens, written to `tokens` when
// given): cut after each `separator`, or at the dataset's document index (std::logic_error when it
// has none: open_dataset refuses such data with masking first).
SampleDocuments documents_of_sample(const Dataset& dataset, uint64_t index, int64_t seq_len,
                                    std::optional<int64_t> separator, std::vector<int32_t>* tokens = nullptr);

// The sum of the squared lengths of the documents among the first `count` tokens (a sample's
// inputs): the (query, key) pairs of its document-masked attention, up to the causal halving.
int64_t squared_document_lengths(const SampleDocuments& documents, int64_t count);

}  // namespace trainer::data
