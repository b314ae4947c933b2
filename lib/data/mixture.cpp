#include "data/mixture.h"

#include <cmath>
#include <stdexcept>

namespace trainer::data {

namespace {
using u128 = unsigned __int128;

// floor(n * share / 2^64 + 1/2), exactly.
uint64_t taken_before(u128 n, uint64_t share) {
  return static_cast<uint64_t>((n * share + (u128{1} << 63)) >> 64);
}
}  // namespace

Mixture::Mixture(const std::vector<double>& weights) {
  if (weights.empty()) throw std::invalid_argument("Mixture: no weights");
  double total = 0;
  for (double w : weights) {
    if (!(w > 0) || !std::isfinite(w)) throw std::invalid_argument("Mixture: weights must be positive and finite");
    total += w;
  }
  for (double w : weights) weights_.push_back(w / total);
  // Suffix sums from the back, so each share is w_j over what remains for datasets j, j+1, ...
  double remaining = 0;
  std::vector<double> suffix(weights.size());
  for (size_t j = weights.size(); j-- > 0;) suffix[j] = remaining += weights[j];
  for (size_t j = 0; j + 1 < weights.size(); ++j) {
    const double scaled = std::ldexp(weights[j] / suffix[j], 64);
    shares_.push_back(scaled >= 0x1p64 ? UINT64_MAX : static_cast<uint64_t>(scaled));
  }
}

MixtureSlot Mixture::locate(uint64_t index) const {
  uint64_t i = index;  // the sample's number among those offered to dataset j
  for (size_t j = 0; j < shares_.size(); ++j) {
    const uint64_t before = taken_before(i, shares_[j]);
    if (taken_before(u128{i} + 1, shares_[j]) > before) return {j, before};
    i -= before;
  }
  return {shares_.size(), i};
}

}  // namespace trainer::data
