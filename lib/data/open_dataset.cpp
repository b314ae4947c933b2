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
    files.push_back(std::move(file));
  }
  return std::make_unique<TokenDataset>(std::move(files), data.weights, static_cast<uint64_t>(recipe.training.seed));
}

}  // namespace

std::unique_ptr<Dataset> open_dataset(const recipe::Recipe& recipe) {
  if (recipe.training.seq_len < 1)
    throw UserError(fmt::format("training.seq_len={} must be >= 1", recipe.training.seq_len));
  const std::string& source = recipe.data.source;
  if (source == "synthetic")
    return std::make_unique<SyntheticDataset>(
        default_synthetic_params(recipe.model.vocab_size, static_cast<uint64_t>(recipe.training.seed)));
  if (source == "tokens") return open_tokens(recipe);
  throw UserError(fmt::format("data.source=\"{}\" is not a data source; expected \"synthetic\" or \"tokens\"", source));
}

}  // namespace trainer::data
