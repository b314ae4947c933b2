#pragma once
// Weighted mixing of several datasets as a pure function of the global sample index.
//
// The datasets form a chain. Dataset 0 takes a fraction a_0 = w_0 / (w_0 + ... + w_{m-1}) of the
// samples, spread evenly: of the first n samples it takes c(n) = floor(n * a_0 + 1/2), so sample
// i is its c(i)-th sample exactly when c(i + 1) > c(i). The samples it leaves are renumbered
// 0, 1, 2, ... (sample i becomes i - c(i)) and offered to dataset 1 with a_1 = w_1 / (w_1 + ...
// + w_{m-1}), and so on; the last dataset takes what is left. Each step is one multiplication
// in 64.64 fixed point, so locating a sample costs O(m) and needs no state and no tables.
//
// Every dataset's count among the first n samples, for every n, is within (m - 1) / 2 of
// n * w_j / sum(w): the weights are realised exactly in the long run and closely at any point.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainer::data {

struct MixtureSlot {
  size_t dataset = 0;        // which dataset global sample i comes from
  uint64_t local_index = 0;  // and which of that dataset's samples it is (0, 1, 2, ... in order)
};

class Mixture {
 public:
  // Weights are positive, at any scale. Throws std::invalid_argument otherwise.
  explicit Mixture(const std::vector<double>& weights);

  MixtureSlot locate(uint64_t index) const;
  size_t size() const { return weights_.size(); }
  const std::vector<double>& weights() const { return weights_; }  // normalised to sum to 1

 private:
  std::vector<double> weights_;
  std::vector<uint64_t> shares_;  // a_j as a fraction of 2^64, for all but the last dataset
};

}  // namespace trainer::data
