// open_dataset: from the recipe's data section to a Dataset, with every problem in the files
// reported as a UserError before training starts.
#include <fmt/format.h>

#include "core/error.h"
#include "data/dataset.h"
#include "data/synthetic_dataset.h"
#include "data/token_dataset.h"
#include "data/token_source.h"

namespace trainer::data {

namespace {

std::unique_ptr<Dataset> open_tokens(const recipe::Recipe& recipe) {
  const auto& data = recipe.data;
  const int64_t seq_len = recipe.training.seq_len;
  if (data.paths.empty())
    throw UserError("data.source=\"tokens\" needs data.paths (token dataset prefixes written by scripts/prepare_data)");
  if (!data.weights.empty() && data.weights.size() != data.paths.size())
    throw UserError(fmt::format("data.weights has {} entries but data.paths has {}; give one weight per path",
                                data.weights.size(), data.paths.size()));
  for (size_t j = 0; j < data.weights.size(); ++j)
    if (!(data.weights[j] > 0))
      throw UserError(fmt::format("data.weights[{}]={} must be > 0", j, data.weights[j]));

  std::vector<std::unique_ptr<TokenSource>> files;
  for (const auto& path : data.paths) {
    auto file = open_token_source(path, data.format, recipe.model.vocab_size);
    if (file->token_count() < static_cast<uint64_t>(seq_len) + 1)
      throw UserError(fmt::format("{}: {} tokens, too few for one sample of training.seq_len + 1 = {} tokens",
                                  file->name(), file->token_count(), seq_len + 1));
    if (data.document_masking && !data.document_separator_token && !file->documents())
      throw UserError(fmt::format("{}: data.document_masking=true, but this {} file has no document index; set "
                                  "data.document_separator_token to the token that ends each document",
                                  file->name(), file->format()));
    files.push_back(std::move(file));
  }
  return std::make_unique<TokenDataset>(std::move(files), data.weights, static_cast<uint64_t>(recipe.training.seed));
}

// Samples [offset, ...) of another dataset: held-out synthetic samples that training never reaches.
class OffsetDataset : public Dataset {
 public:
  OffsetDataset(std::unique_ptr<Dataset> inner, uint64_t offset) : inner_(std::move(inner)), offset_(offset) {}
  void sample(uint64_t index, int64_t seq_len, int32_t* out) const override {
    inner_->sample(offset_ + index, seq_len, out);
  }
  std::optional<std::vector<int64_t>> document_starts(uint64_t index, int64_t seq_len) const override {
    return inner_->document_starts(offset_ + index, seq_len);
  }
  std::optional<double> entropy_floor() const override { return inner_->entropy_floor(); }
  std::string describe() const override { return "held-out samples of " + inner_->describe(); }

 private:
  std::unique_ptr<Dataset> inner_;
  uint64_t offset_;
};

}  // namespace

std::unique_ptr<Dataset> open_evaluation_dataset(const recipe::Recipe& recipe) {
  if (!recipe.evaluation.paths.empty()) {
    recipe::Recipe held_out = recipe;
    held_out.data.source = recipe::DataSource::Tokens;
    held_out.data.paths = recipe.evaluation.paths;
    held_out.data.weights.clear();
    return open_tokens(held_out);
  }
  if (recipe.data.source != recipe::DataSource::Synthetic)
    throw UserError("evaluation.paths is empty: name held-out token datasets to evaluate on (held-out samples "
                    "without files exist only for data.source=\"synthetic\")");
  return std::make_unique<OffsetDataset>(open_dataset(recipe), uint64_t(1) << 62);
}

std::unique_ptr<Dataset> open_dataset(const recipe::Recipe& recipe) {
  if (recipe.training.seq_len < 1)
    throw UserError(fmt::format("training.seq_len={} must be >= 1", recipe.training.seq_len));
  if (recipe.data.source == recipe::DataSource::Tokens) return open_tokens(recipe);
  return std::make_unique<SyntheticDataset>(
      default_synthetic_params(recipe.model.vocab_size, static_cast<uint64_t>(recipe.training.seed)));
}

}  // namespace trainer::data
