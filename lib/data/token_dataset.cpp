#include "data/token_dataset.h"

#include <fmt/format.h>

#include <stdexcept>

#include "data/counter_rng.h"
#include "data/window_order.h"

namespace trainer::data {

namespace {
// Separates the window order's random numbers from anything else keyed by the same seed.
constexpr uint64_t kTokenOrderDomain = 0x746f6b656e6f7264ULL;  // "tokenord"

std::vector<double> weights_or_sizes(const std::vector<std::unique_ptr<TokenSource>>& files,
                                     std::vector<double> weights) {
  if (files.empty()) throw std::invalid_argument("TokenDataset: no files");
  if (weights.empty()) {
    for (const auto& file : files) weights.push_back(static_cast<double>(file->token_count()));
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

TokenDataset::TokenDataset(std::vector<std::unique_ptr<TokenSource>> sources, std::vector<double> weights,
                           uint64_t seed)
    : mixture_(weights_or_sizes(sources, std::move(weights))), key_(hash_words(kTokenOrderDomain, seed)) {
  sources_ = std::move(sources);
}

namespace {
std::vector<std::unique_ptr<TokenSource>> as_sources(std::vector<TokenFile> files) {
  std::vector<std::unique_ptr<TokenSource>> sources;
  for (auto& file : files) sources.push_back(std::make_unique<TokenFile>(std::move(file)));
  return sources;
}
}  // namespace

TokenDataset::TokenDataset(std::vector<TokenFile> files, std::vector<double> weights, uint64_t seed)
    : TokenDataset(as_sources(std::move(files)), std::move(weights), seed) {}

TokenSampleLocation TokenDataset::locate(uint64_t index, int64_t seq_len) const {
  const MixtureSlot slot = mixture_.locate(index);
  const TokenSource& file = *sources_[slot.dataset];
  const uint64_t windows = window_count(file.token_count(), seq_len);
  if (windows == 0)
    throw std::invalid_argument(fmt::format("{}: {} tokens cannot hold a sample of {} + 1", file.name(),
                                            file.token_count(), seq_len));
  const uint64_t epoch = slot.local_index / windows;
  const uint64_t position = slot.local_index % windows;
  return {slot.dataset, epoch, permuted_window(position, windows, hash_words(key_, slot.dataset, epoch))};
}

void TokenDataset::sample(uint64_t index, int64_t seq_len, int32_t* out) const {
  const TokenSampleLocation at = locate(index, seq_len);
  sources_[at.dataset]->read(at.window * static_cast<uint64_t>(seq_len), static_cast<uint64_t>(seq_len) + 1, out);
}

std::optional<std::vector<int64_t>> TokenDataset::document_starts(uint64_t index, int64_t seq_len) const {
  const TokenSampleLocation at = locate(index, seq_len);
  const TokenSource& file = *sources_[at.dataset];
  if (!file.documents()) return std::nullopt;
  const uint64_t begin = at.window * static_cast<uint64_t>(seq_len);
  std::vector<int64_t> starts;
  for (uint64_t offset : file.document_starts(begin + 1, static_cast<uint64_t>(seq_len)))
    starts.push_back(int64_t(offset - begin));
  return starts;
}

std::string TokenDataset::describe() const {
  uint64_t tokens = 0, documents = 0;
  bool all_documents = true;
  std::string formats;
  for (const auto& file : sources_) {
    tokens += file->token_count();
    if (const auto d = file->documents())
      documents += *d;
    else
      all_documents = false;
    if (formats.find(file->format()) == std::string::npos) formats += (formats.empty() ? "" : "+") + file->format();
  }
  std::string text = fmt::format("tokens: {} file{} ({}), {}{} tokens", sources_.size(),
                                 sources_.size() == 1 ? "" : "s", formats,
                                 all_documents ? fmt::format("{} document{}, ", short_count(documents),
                                                             documents == 1 ? "" : "s")
                                               : "",
                                 short_count(tokens));
  if (sources_.size() > 1) {
    text += ", weights ";
    for (size_t j = 0; j < sources_.size(); ++j) text += fmt::format("{}{:.3g}", j ? "/" : "", mixture_.weights()[j]);
  }
  return text;
}

}  // namespace trainer::data
