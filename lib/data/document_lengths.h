#pragma once
// The document-length distribution of token files and the attention work it implies under
// document masking (`trainer data inspect --lengths`, scripts/bench_documents). Torch-free.
#include <cstdint>
#include <optional>
#include <vector>

#include "data/token_source.h"

namespace trainer::data {

// Every document's length in tokens, in order: from the source's document index, or cut after
// each `separator` token (the separator ends its document; tokens after the last one form the
// last document). Throws std::logic_error for a source without an index and no separator.
std::vector<int64_t> document_lengths(const TokenSource& source, std::optional<int64_t> separator);

// The windows training cuts from these documents concatenated (seq_len + 1 tokens with stride
// seq_len, token_dataset.h): each window's attention work under document masking, the sum of the
// squares of its documents' lengths among its seq_len inputs.
std::vector<double> window_attention_work(const std::vector<int64_t>& lengths, int64_t seq_len);

// Predicted balance of global batches of dp x accumulation x micro_batch_size windows drawn in a
// seeded shuffled order (window_order.h): the mean over global batches of the slowest rank's
// attention work over the mean rank's, with data.balance "none" (contiguous), "cost"
// (batch_balance.h) and torchtitan's token-count packing (samples of equal length, so contiguous),
// over at most `batches` global batches.
struct PredictedBalance {
  int64_t global_batches = 0;
  double contiguous = 1, balanced = 1;
  double attention_fraction = 1;  // mean window work / seq_len^2: the masked share of full attention
};
PredictedBalance predict_balance(const std::vector<double>& window_work, int64_t seq_len, int64_t dp,
                                 int64_t accumulation, int64_t micro_batch_size, int64_t batches, uint64_t seed);

}  // namespace trainer::data
