#pragma once
// What document masking does to a step (data.document_masking), from the length distribution the
// recipe describes (data.document_length_median and data.document_length_p99: a log-normal
// through those two percentiles, as `trainer data inspect --lengths` measures them on the files):
// the attention work of a window as a fraction of full causal attention, and how unevenly that
// work falls on the data-parallel ranks with data.balance "none" and "cost" (data/batch_balance.h),
// simulated on windows cut from seeded draws of the distribution.
#include <cstdint>
#include <optional>

#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::estimate {

struct DocumentWork {
  int64_t median = 0, p99 = 0;   // the recipe's description, tokens
  double attention_fraction = 1;  // mean window's sum of squared document lengths / seq_len^2
  double imbalance_none = 1, imbalance_cost = 1;  // slowest rank's attention work / the mean rank's
  double imbalance = 1;           // of the recipe's data.balance
  int64_t global_batches = 0;     // simulated
};

// None without masking or without the two keys.
std::optional<DocumentWork> document_work(const recipe::Recipe& recipe, const recipe::MeshShape& mesh);

}  // namespace trainer::estimate
