#pragma once
// Samples from token files (data.source "tokens"). Each dataset is cut into windows of
// seq_len + 1 tokens with stride seq_len (window w holds tokens [w*seq_len, (w+1)*seq_len], so
// every token but the first is a target exactly once per epoch); windows run across document
// boundaries. Global sample i is located in two pure steps:
//   1. the mixture (data/mixture.h) names the dataset j and the sample's number k within it;
//   2. epoch e = k / W_j and position p = k % W_j (W_j windows), and the window is
//      permuted_window(p, W_j, hash(seed, j, e)): a fresh shuffle each epoch.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/mixture.h"
#include "data/token_file.h"
#include "data/token_source.h"

namespace trainer::data {

// Where a global sample's tokens come from.
struct TokenSampleLocation {
  size_t dataset = 0;
  uint64_t epoch = 0;
  uint64_t window = 0;  // the sample is tokens [window * seq_len, window * seq_len + seq_len]
};

class TokenDataset final : public Dataset {
 public:
  // weights: one per file, or empty for weights in proportion to each file's token count.
  // Throws std::invalid_argument on a weight count mismatch or a non-positive weight (the
  // recipe's validation reports those to the user first).
  TokenDataset(std::vector<std::unique_ptr<TokenSource>> sources, std::vector<double> weights, uint64_t seed);
  TokenDataset(std::vector<TokenFile> files, std::vector<double> weights, uint64_t seed);

  // Requires every file to hold at least seq_len + 1 tokens (open_dataset checks it for the
  // recipe's seq_len; other lengths throw std::invalid_argument when a file is too short).
  void sample(uint64_t index, int64_t seq_len, int32_t* out) const override;
  // From the sample's file's document index; std::nullopt for a file without one.
  std::optional<std::vector<int64_t>> document_starts(uint64_t index, int64_t seq_len) const override;
  std::optional<double> entropy_floor() const override { return std::nullopt; }
  // "tokens: 2 files, 40 documents, 1.2M tokens, weights 0.75/0.25"
  std::string describe() const override;

  TokenSampleLocation locate(uint64_t index, int64_t seq_len) const;
  const std::vector<std::unique_ptr<TokenSource>>& sources() const { return sources_; }
  const Mixture& mixture() const { return mixture_; }

 private:
  std::vector<std::unique_ptr<TokenSource>> sources_;
  Mixture mixture_;
  uint64_t key_ = 0;
};

// Windows of seq_len + 1 tokens with stride seq_len in `tokens` tokens: (tokens - 1) / seq_len.
uint64_t window_count(uint64_t tokens, int64_t seq_len);

}  // namespace trainer::data
