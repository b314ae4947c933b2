#include "parallel/pipeline/layer_split.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace trainer::parallel {

double head_cost_in_layers(const recipe::ModelConfig& m) {
  const double d = double(m.head_dim), h = double(m.hidden_size);
  double attention = h * d * double(m.num_attention_heads + 2 * m.num_key_value_heads) +
                     double(m.num_attention_heads) * d * h;
  if (m.mla) {  // the projections' weights (their FLOPs per token follow them)
    const auto& a = *m.mla;
    const double heads = double(m.num_attention_heads), qk = double(a.qk_head_dim());
    const double q = a.q_lora_rank ? h * double(*a.q_lora_rank) + double(*a.q_lora_rank) * heads * qk : h * heads * qk;
    attention = q + h * double(a.kv_lora_rank + a.qk_rope_head_dim) +
                double(a.kv_lora_rank) * heads * double(a.qk_nope_head_dim + a.v_head_dim) + heads * double(a.v_head_dim) * h;
  }
  const double layer = attention + 3.0 * h * double(m.intermediate_size);
  if (layer <= 0) return 0.0;
  // Each multi-token prediction module: one more layer, its eh_proj (2h x h) and one more head.
  const double modules = double(m.num_nextn_predict_layers);
  return (1.0 + modules) * double(m.vocab_size) * h / layer + modules * (1.0 + 2.0 * h * h / layer);
}

std::vector<int64_t> balanced_layer_split(int64_t layers, int64_t chunks, double head_cost) {
  if (chunks < 1) throw std::invalid_argument("balanced_layer_split: chunks must be >= 1");
  if (chunks == 1) return {layers};
  const int64_t middle = chunks - 2;
  if (layers < middle)
    throw std::invalid_argument(fmt::format("{} layers cannot give each of the {} middle chunks a layer", layers, middle));
  // Layers cost the same, so for a given count on the last chunk the rest is best split evenly
  // (earlier chunks one more); try every count for the last chunk.
  auto rest_split = [&](int64_t rest) {
    std::vector<int64_t> split(size_t(chunks - 1), 0);
    if (rest < chunks - 1) {  // exactly one layer per middle chunk, none on the first
      for (int64_t c = 1; c < chunks - 1; ++c) split[size_t(c)] = 1;
      return split;
    }
    for (int64_t c = 0; c < chunks - 1; ++c) split[size_t(c)] = rest / (chunks - 1) + (c < rest % (chunks - 1) ? 1 : 0);
    return split;
  };
  // The smallest largest cost; among those, the smallest spread between the costliest and the
  // cheapest chunk.
  double best = std::numeric_limits<double>::infinity(), best_spread = best;
  int64_t best_last = 0;
  for (int64_t last = 0; last <= layers - middle; ++last) {
    const std::vector<int64_t> split = rest_split(layers - last);
    const double tail = double(last) + head_cost;
    const double most = std::max(tail, double(*std::max_element(split.begin(), split.end())));
    const double least = std::min(tail, double(*std::min_element(split.begin(), split.end())));
    if (most < best - 1e-12 || (most < best + 1e-12 && most - least < best_spread - 1e-12)) {
      best = most;
      best_spread = most - least;
      best_last = last;
    }
  }
  std::vector<int64_t> split = rest_split(layers - best_last);
  split.push_back(best_last);
  return split;
}

std::vector<int64_t> layer_split(const recipe::Recipe& r, int64_t chunks) {
  const auto& layout = r.parallel.pipeline_layout;
  const int64_t layers = r.model.num_hidden_layers;
  if (layout.empty()) return balanced_layer_split(layers, chunks, chunks > 1 ? head_cost_in_layers(r.model) : 0.0);
  if (int64_t(layout.size()) != chunks ||
      std::accumulate(layout.begin(), layout.end(), int64_t(0)) != layers)
    throw std::invalid_argument(fmt::format("parallel.pipeline_layout has {} entries summing to {}; expected {} "
                                            "summing to {}",
                                            layout.size(), std::accumulate(layout.begin(), layout.end(), int64_t(0)),
                                            chunks, layers));
  return layout;
}

}  // namespace trainer::parallel
