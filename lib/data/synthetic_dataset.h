#pragma once
// Synthetic data with learnable structure and an exactly known loss floor: an order-1 Markov
// chain over the vocabulary in which every token has the same number k of distinct successors,
// taken with the same probabilities p (in an order that differs per token). The next token
// depends only on the current one and always has entropy H(p), so the best possible model's
// loss is H(p) nats per target whatever it has seen before. A model first learns that only k
// of the vocabulary follow each token, then which ones with which probability: the loss falls
// from ln(vocab) towards H(p) within tens of steps for a small transformer.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace trainer::data {

struct SyntheticParams {
  int64_t vocab_size = 256;
  uint64_t seed = 1234;
  // Probabilities of a token's successors, most likely first; sums to 1. Its size is k.
  std::vector<double> successor_probs = {0.5, 0.25, 0.15, 0.1};
};

// The default successor probabilities cut to at most vocab_size entries and renormalised.
SyntheticParams default_synthetic_params(int64_t vocab_size, uint64_t seed);

class SyntheticDataset final : public Dataset {
 public:
  // Throws UserError when vocab_size < 1, std::invalid_argument when the probabilities are not a
  // distribution over at most vocab_size successors.
  explicit SyntheticDataset(SyntheticParams params);

  // Token 0 is uniform over the vocabulary (it is never a target); token t + 1 is successor
  // r of token t with probability p[r]. Every draw is a hash of (seed, index, position).
  void sample(uint64_t index, int64_t seq_len, int32_t* out) const override;
  // H(p) = -sum p[r] ln p[r].
  std::optional<double> entropy_floor() const override;
  std::string describe() const override;

  // The r-th successor of `token` (the one drawn with probability p[r]); for tests.
  int32_t successor(int32_t token, int rank) const { return successors_[token * k_ + rank]; }
  int successor_count() const { return k_; }

 private:
  SyntheticParams params_;
  int k_ = 0;
  uint64_t key_ = 0;
  std::vector<int32_t> successors_;  // vocab_size x k, row-major
  std::vector<uint64_t> thresholds_;  // successor r is drawn when the hash is < thresholds_[r]
};

}  // namespace trainer::data
