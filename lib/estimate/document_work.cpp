#include "estimate/document_work.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "data/document_lengths.h"

namespace trainer::estimate {

std::optional<DocumentWork> document_work(const recipe::Recipe& recipe, const recipe::MeshShape& mesh) {
  const auto& d = recipe.data;
  if (!d.document_masking || !d.document_length_median || !d.document_length_p99) return std::nullopt;
  DocumentWork w;
  w.median = *d.document_length_median;
  w.p99 = *d.document_length_p99;
  const int64_t seq = recipe.training.seq_len, micro = recipe.training.micro_batch_size;
  const int64_t global = mesh.dp * mesh.grad_accum_steps * micro;
  // Enough windows for 64 global batches, at least 512, at most 16384 (or one global batch).
  const int64_t windows = std::max(global, std::clamp<int64_t>(64 * global, 512, 16384));
  // log L ~ N(mu, sigma): the median is e^mu, the 99th percentile e^(mu + 2.3263 sigma).
  const double mu = std::log(double(w.median));
  const double sigma = std::max(0.0, std::log(double(w.p99) / double(w.median)) / 2.3263478740408408);
  std::mt19937_64 random(1234);
  std::lognormal_distribution<double> draw(mu, sigma);
  std::vector<int64_t> lengths;
  const int64_t tokens = windows * seq + 1;
  for (int64_t total = 0; total < tokens;) {
    const int64_t l = std::max<int64_t>(1, std::llround(draw(random)));
    lengths.push_back(l);
    total += l;
  }
  const auto work = data::window_attention_work(lengths, seq);
  const auto p = data::predict_balance(work, seq, mesh.dp, mesh.grad_accum_steps, micro,
                                       std::max<int64_t>(1, std::min<int64_t>(64, int64_t(work.size()) / global)), 1234);
  w.attention_fraction = p.attention_fraction;
  w.imbalance_none = p.contiguous;
  w.imbalance_cost = p.balanced;
  w.imbalance = d.balanced() ? p.balanced : p.contiguous;
  w.global_batches = p.global_batches;
  return w;
}

}  // namespace trainer::estimate
