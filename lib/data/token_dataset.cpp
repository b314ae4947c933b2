#include "data/token_dataset.h"

#include <fmt/format.h>

#include <stdexcept>

#include "data/counter_rng.h"
#include "data/window_order.h"

namespace trainer::data {

namespace {
// Separates the window order's random numbers from anything else keyed by the same seed.
constexpr uint64_t kTokenOrderDomain = 0x746f6b656e6f7264ULL;  // "tokenord"

std::vector<double> weights_or_sizes(const std::vector<TokenFile>& files, std::vector<double> weights) {
  if (files.empty()) throw std::invalid_argument("TokenDataset: no files");
  if (weights.empty()) {
    for (const auto& file : files) weights.push_back(static_cast<double>(file.token_count()));
  } else if (weights.size() != files.size()) {
    throw std::invalid_argument(fmt::format("TokenDataset: {} weights for {} files", weights.size(), files.size()));
  }
  return weights;
}

// 1234 -> "1234", 1234567 -> "1.2M".
std::string short_count(uint64_t n) {
  if (n < 10000) return fmt::format("{}", n);
  const char* units[] = {"K", "M", "B", "T"};
  double value = static_cast<double>(n);
  int unit = -1;
  while (value >= 1000 && unit < 3) {
    value /= 1000;
    ++unit;
  }
  return fmt::format("{:.1f}{}", value, units[unit]);
}
}  // namespace

uint64_t window_count(uint64_t tokens, int64_t seq_len) {
  if (seq_len < 1) throw std::invalid_argument("window_count: seq_len must be >= 1");
  return tokens == 0 ? 0 : (tokens - 1) / static_cast<uint64_t>(seq_len);
}

TokenDataset::TokenDataset(std::vector<TokenFile> files, std::vector<double> weights, uint64_t seed)
    : mixture_(weights_or_sizes(files, std::move(weights))),
      key_(hash_words(kTokenOrderDomain, seed)) {
  files_ = std::move(files);
}

TokenSampleLocation TokenDataset::locate(uint64_t index, int64_t seq_len) const {
  const MixtureSlot slot = mixture_.locate(index);
  const TokenFile& file = files_[slot.dataset];
  const uint64_t windows = window_count(file.token_count(), seq_len);
  if (windows == 0)
    throw std::invalid_argument(fmt::format("{}.bin: {} tokens cannot hold a sample of {} + 1", file.prefix(),
                                            file.token_count(), seq_len));
  const uint64_t epoch = slot.local_index / windows;
  const uint64_t position = slot.local_index % windows;
  return {slot.dataset, epoch, permuted_window(position, windows, hash_words(key_, slot.dataset, epoch))};
}

void TokenDataset::sample(uint64_t index, int64_t seq_len, int32_t* out) const {
  const TokenSampleLocation at = locate(index, seq_len);
  files_[at.dataset].read(at.window * static_cast<uint64_t>(seq_len), static_cast<uint64_t>(seq_len) + 1, out);
}

std::string TokenDataset::describe() const {
  uint64_t tokens = 0, documents = 0;
  for (const auto& file : files_) {
    tokens += file.token_count();
    documents += file.document_count();
  }
  std::string text = fmt::format("tokens: {} file{}, {} document{}, {} tokens", files_.size(),
                                 files_.size() == 1 ? "" : "s", short_count(documents), documents == 1 ? "" : "s",
                                 short_count(tokens));
  if (files_.size() > 1) {
    text += ", weights ";
    for (size_t j = 0; j < files_.size(); ++j) text += fmt::format("{}{:.3g}", j ? "/" : "", mixture_.weights()[j]);
  }
  return text;
}

}  // namespace trainer::data
