#pragma once
// The training data as a pure function from a global sample index to tokens. Every rank of every
// mesh computes the same tokens for the same index, so data order is global (DESIGN.md invariant
// 2), data-parallel ranks take disjoint index ranges, and resuming needs nothing but the number
// of samples consumed. Torch-free.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::data {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Writes the seq_len + 1 tokens of global sample `index` to out[0..seq_len] (inputs are
  // out[0..seq_len), targets out[1..seq_len]). A pure function of (the dataset files or synthetic
  // parameters, the seed, index): no internal cursor, safe to call from several threads, any
  // index >= 0 valid (datasets wrap around in epochs). This is what makes data order global
  // (DESIGN invariant 2) and resume exact: the position is just the number of samples consumed.
  virtual void sample(uint64_t index, int64_t seq_len, int32_t* out) const = 0;
  // Where documents start in sample `index` (the positions p in 1..seq_len whose token begins a
  // document, in order), from the data's document index; std::nullopt where the data has none
  // (synthetic samples, llm.c shards). The same pure function of the index as sample().
  virtual std::optional<std::vector<int64_t>> document_starts(uint64_t index, int64_t seq_len) const {
    (void)index;
    (void)seq_len;
    return std::nullopt;
  }
  // Expected loss floor in nats per predicted token when known (synthetic data), else std::nullopt.
  virtual std::optional<double> entropy_floor() const = 0;
  // One line for the log: "synthetic (order-1 Markov, vocab 256, 4 successors per token, floor
  // 1.2080 nats)" or "tokens: 2 files, 40.1K documents, 1.2M tokens, weights 0.7/0.3".
  virtual std::string describe() const = 0;
};

// Opens the data the recipe names (recipe.data, recipe.training.seed, recipe.model.vocab_size,
// recipe.training.seq_len). Bad input throws UserError naming the file: missing, truncated, wrong
// magic/version/header, token ids >= vocab_size, a dataset with fewer than seq_len + 1 tokens.
std::unique_ptr<Dataset> open_dataset(const recipe::Recipe& recipe);

// The held-out data of evaluation: evaluation.paths (in data.format), or with synthetic data the
// generator's samples from index 2^62 on, which no training run reaches. The same errors as
// open_dataset.
std::unique_ptr<Dataset> open_evaluation_dataset(const recipe::Recipe& recipe);

}  // namespace trainer::data
