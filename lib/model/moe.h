#pragma once
// Mixture-of-experts feed-forward (Mixtral names): a softmax router picks the top-k experts per
// token; their outputs are weighted by the renormalised top-k probabilities. Dropless by default;
// with a capacity factor each expert takes at most ceil(cf * tokens * k / experts) tokens (later
// ones in token order are dropped). Optional shared experts see every token.
//
// Dispatch: the token copies are sorted by expert, run through their expert's SwiGLU and
// scatter-added back with their routing weights. Under expert parallelism each ep rank holds
// E / ep consecutive experts: the sorted copies go to their experts' ranks by an all-to-all with
// uneven splits (the counts are exchanged first), the local experts run on what arrives (grouped
// by expert), and a second all-to-all brings the results back. The capacity factor applies to
// this rank's tokens before the exchange, so drops do not depend on ep.
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "model/layers.h"
#include "recipe/recipe.h"

namespace trainer::model {

struct MoeOutput {
  at::Tensor output;        // [B, T, hidden]
  at::Tensor aux_loss;      // load-balancing loss N_E * sum_i f_i * P_i (fp32 scalar), not yet weighted
  at::Tensor tokens_per_expert;  // int64 [E], after top-k and capacity (for metrics and tests)
};

class Moe {
 public:
  Moe() = default;
  Moe(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp,
      ExpertParallel ep = {});
  MoeOutput forward(const at::Tensor& x) const;

 private:
  // The local experts' SwiGLU on `rows` [sum(lengths), H] grouped by local expert.
  at::Tensor run_local_experts(const at::Tensor& rows, const std::vector<int64_t>& lengths) const;

  Linear router_;
  std::vector<SwigluMlp> experts_;  // this rank's: global experts first_expert_ ..
  ExpertParallel ep_;
  int64_t first_expert_ = 0;
  std::optional<SwigluMlp> shared_;
  int64_t num_experts_ = 0, top_k_ = 0;
  std::optional<double> capacity_factor_;
};

// The load-balancing loss from router probabilities [N, E] and chosen experts [N, k]:
// N_E * sum_i f_i * P_i with f_i = (tokens routed to i) / (N * k) and P_i = mean probability of i.
// It is 1 for perfectly balanced routing (Switch Transformer / Megatron normalisation).
at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& chosen, int64_t num_experts);

}  // namespace trainer::model
