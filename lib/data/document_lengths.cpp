#include "data/document_lengths.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "data/batch_balance.h"
#include "data/token_dataset.h"
#include "data/window_order.h"

namespace trainer::data {

std::vector<int64_t> document_lengths(const TokenSource& source, std::optional<int64_t> separator) {
  const uint64_t total = source.token_count();
  std::vector<int64_t> lengths;
  if (!separator) {
    const std::vector<uint64_t> starts = source.document_starts(0, total);
    uint64_t previous = 0;
    for (const uint64_t s : starts)
      if (s > previous) {
        lengths.push_back(int64_t(s - previous));
        previous = s;
      }
    if (total > previous) lengths.push_back(int64_t(total - previous));
    return lengths;
  }
  constexpr uint64_t kChunk = uint64_t(1) << 20;
  std::vector<int32_t> tokens(kChunk);
  int64_t current = 0;
  for (uint64_t begin = 0; begin < total; begin += kChunk) {
    const uint64_t count = std::min(kChunk, total - begin);
    source.read(begin, count, tokens.data());
    for (uint64_t i = 0; i < count; ++i) {
      ++current;
      if (tokens[i] == *separator) {
        lengths.push_back(current);
        current = 0;
      }
    }
  }
  if (current > 0) lengths.push_back(current);
  return lengths;
}

std::vector<double> window_attention_work(const std::vector<int64_t>& lengths, int64_t seq_len) {
  uint64_t total = 0;
  for (const int64_t l : lengths) total += uint64_t(l);
  const uint64_t windows = window_count(total, seq_len);
  std::vector<double> work(windows, 0.0);
  // Sweep the documents once: each adds the square of its overlap with every window's inputs.
  uint64_t start = 0;
  for (const int64_t l : lengths) {
    const uint64_t end = start + uint64_t(l);
    for (uint64_t w = start / uint64_t(seq_len); w < windows && w * uint64_t(seq_len) < end; ++w) {
      const uint64_t a = std::max(start, w * uint64_t(seq_len)), b = std::min(end, (w + 1) * uint64_t(seq_len));
      if (b > a) work[w] += double(b - a) * double(b - a);
    }
    start = end;
  }
  return work;
}

PredictedBalance predict_balance(const std::vector<double>& window_work, int64_t seq_len, int64_t dp,
                                 int64_t accumulation, int64_t micro_batch_size, int64_t batches, uint64_t seed) {
  const uint64_t windows = window_work.size();
  const int64_t size = dp * accumulation * micro_batch_size;
  if (windows == 0) throw std::invalid_argument("predict_balance: no windows");
  PredictedBalance p;
  double sum = 0;
  for (const double w : window_work) sum += w;
  p.attention_fraction = sum / double(windows) / (double(seq_len) * double(seq_len));
  double contiguous = 0, balanced = 0;
  for (int64_t k = 0; k < batches; ++k) {
    std::vector<double> costs;
    for (int64_t i = 0; i < size; ++i) {
      const uint64_t position = uint64_t(k * size + i);
      // Epoch e's own permutation, as training draws windows (window_order.h).
      const uint64_t epoch = position / windows;
      costs.push_back(window_work[permuted_window(position % windows, windows, seed + epoch)]);
    }
    contiguous += max_over_mean(rank_loads(plan_global_batch(costs, dp, accumulation, micro_batch_size, false), costs));
    balanced += max_over_mean(rank_loads(plan_global_batch(costs, dp, accumulation, micro_batch_size, true), costs));
    ++p.global_batches;
  }
  if (p.global_batches > 0) {
    p.contiguous = contiguous / double(p.global_batches);
    p.balanced = balanced / double(p.global_batches);
  }
  return p;
}

}  // namespace trainer::data
