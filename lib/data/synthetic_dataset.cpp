#include "data/synthetic_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "core/error.h"
#include "data/counter_rng.h"

namespace trainer::data {

namespace {
// Separates the synthetic data's random numbers from anything else keyed by the same seed
// (parameter initialisation, token-dataset order).
constexpr uint64_t kSyntheticDomain = 0x73796e7468657469ULL;  // "synthetic"
constexpr uint64_t kTableStream = 1, kSampleStream = 2;
}  // namespace

SyntheticParams default_synthetic_params(int64_t vocab_size, uint64_t seed) {
  SyntheticParams params;
  params.vocab_size = vocab_size;
  params.seed = seed;
  if (vocab_size >= 1 && static_cast<int64_t>(params.successor_probs.size()) > vocab_size) {
    params.successor_probs.resize(vocab_size);
    double total = std::accumulate(params.successor_probs.begin(), params.successor_probs.end(), 0.0);
    for (double& p : params.successor_probs) p /= total;
  }
  return params;
}

SyntheticDataset::SyntheticDataset(SyntheticParams params) : params_(std::move(params)) {
  const int64_t vocab = params_.vocab_size;
  if (vocab < 1) throw UserError(fmt::format("model.vocab_size={} cannot hold synthetic data; it must be >= 1", vocab));
  const auto& probs = params_.successor_probs;
  if (probs.empty() || static_cast<int64_t>(probs.size()) > vocab)
    throw std::invalid_argument(fmt::format("synthetic data: {} successor probabilities for vocabulary {}", probs.size(), vocab));
  double total = 0;
  for (double p : probs) {
    if (!(p > 0)) throw std::invalid_argument("synthetic data: successor probabilities must be > 0");
    total += p;
  }
  if (std::abs(total - 1.0) > 1e-9) throw std::invalid_argument("synthetic data: successor probabilities must sum to 1");
  k_ = static_cast<int>(probs.size());
  key_ = hash_words(kSyntheticDomain, params_.seed);

  // Cumulative probabilities as 64-bit thresholds, so a draw is one hash and k comparisons; the
  // last is the largest word, so rounding can never leave a hash without a successor.
  double cumulative = 0;
  for (int r = 0; r < k_; ++r) {
    cumulative += probs[r];
    const double scaled = std::ldexp(cumulative / total, 64);
    thresholds_.push_back(r + 1 == k_ || scaled >= 0x1p64 ? UINT64_MAX : static_cast<uint64_t>(scaled));
  }

  // Each token's k successors: distinct (so the conditional entropy is exactly H(p)), drawn
  // uniformly; the draw order is the rank, so which successor is most likely differs per token.
  successors_.resize(static_cast<size_t>(vocab) * k_);
  for (int64_t token = 0; token < vocab; ++token) {
    int32_t* row = &successors_[static_cast<size_t>(token) * k_];
    uint64_t attempt = 0;
    for (int r = 0; r < k_;) {
      auto candidate = static_cast<int32_t>(below(hash_words(key_, kTableStream, token, attempt++), vocab));
      if (std::find(row, row + r, candidate) == row + r) row[r++] = candidate;
    }
  }
}

void SyntheticDataset::sample(uint64_t index, int64_t seq_len, int32_t* out) const {
  const uint64_t sample_key = hash_words(key_, kSampleStream, index);
  auto token = static_cast<int32_t>(below(hash_words(sample_key, 0), params_.vocab_size));
  out[0] = token;
  for (int64_t t = 1; t <= seq_len; ++t) {
    const uint64_t u = hash_words(sample_key, static_cast<uint64_t>(t));
    int rank = 0;
    while (u >= thresholds_[rank]) ++rank;
    token = successors_[static_cast<size_t>(token) * k_ + rank];
    out[t] = token;
  }
}

std::optional<double> SyntheticDataset::entropy_floor() const {
  double entropy = 0;
  for (double p : params_.successor_probs) entropy -= p * std::log(p);
  return entropy;
}

std::string SyntheticDataset::describe() const {
  return fmt::format("synthetic (order-1 Markov, vocab {}, {} successors per token, floor {:.4f} nats)",
                     params_.vocab_size, k_, *entropy_floor());
}

}  // namespace trainer::data
