#pragma once
// Mixture-of-experts feed-forward (Mixtral names): a softmax router picks the top-k experts per
// token; their outputs are weighted by the renormalised top-k probabilities. Dropless by default;
// with a capacity factor each expert takes at most ceil(cf * tokens * k / experts) copies of the
// micro-batch's tokens, the highest-scoring ones (model/moe_routing.h). Optional shared experts
// see every token.
//
// Dispatch: the token copies are sorted by expert, run through their experts' SwiGLU as grouped
// GEMMs (model/grouped_experts.h) and scatter-added back with their routing weights. Under expert
// parallelism (model/expert_dispatcher.h) each ep rank holds E / ep consecutive experts: the sorted copies go to their
// experts' ranks by an all-to-all with uneven splits (the counts are exchanged first), shared
// experts compute while the tokens travel, the local experts run on what arrives (grouped by
// expert), and a second all-to-all brings the results back. With expert tensor parallelism (etp >
// 1) each expert's width is split over the etp group: the rows that arrived are gathered over etp
// (uneven, counts first), every etp rank computes its slice of every expert's output for all of
// them, and the partial outputs go back to the rows' etp rank and are summed there.
//
// MoE parallel folding: the experts' gradients are summed over edp; under tensor parallelism
// (which requires sequence parallelism) each tp rank routes its own part of the sequence, the
// router's gradient is summed over tp too, and shared experts are tensor-parallel like a dense MLP.
#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "model/expert_dispatcher.h"
#include "model/grouped_experts.h"
#include "model/layers.h"
#include "model/moe_routing.h"
#include "recipe/recipe.h"

namespace trainer::model {

struct MoeOutput {
  at::Tensor output;             // [B, T, hidden] (or [s, b, hidden]: any leading dimensions)
  at::Tensor aux_loss;           // this rank's part of the load-balancing loss (fp32 scalar), unweighted
  at::Tensor z_loss;             // this rank's part of the router z-loss (fp32 scalar), unweighted
  at::Tensor tokens_per_expert;  // int64 [E]: this rank's copies kept per expert (after capacity)
};

// What one MoE layer gathers over a training step: the load statistics for metrics, and the
// running counts of the global-batch scope. Reset at the start of every step.
struct MoeStepState {
  at::Tensor tokens_per_expert;  // fp32 [E] on the CPU: this rank's kept copies per expert, summed over micro-batches
  at::Tensor min_margin;         // fp32: the smallest top-k margin seen (Routing::margin)
  at::Tensor z_loss;             // fp32: this rank's z-loss parts, summed over micro-batches
  at::Tensor batch_counts;       // fp32 [E]: global-batch scope, copies per expert over the step so far
  int64_t batch_slots = 0;       // global-batch scope: micro-batch time slots counted
  // Under full recomputation: the frequencies each first pass used, replayed in backward.
  std::deque<at::Tensor> replay;
  void reset();
};

class Moe {
 public:
  Moe() = default;
  // fused_swiglu: the shared experts' activation product by kernels/swiglu on CUDA
  // (model/fused_kernels.h); the routed experts' grouped GEMMs keep ATen's ops.
  Moe(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config, TensorParallel tp,
      ExpertParallel ep = {}, GroupedGemm gemm = GroupedGemm::Auto, bool fused_swiglu = false);
  // x: [..., hidden], tokens in row-major order. token_keys: int64 [tokens], a key per token that
  // orders the micro-batch the same way on every mesh (position * batch + sample); undefined: the
  // token's index.
  MoeOutput forward(const at::Tensor& x, const at::Tensor& token_keys = {}) const;
  MoeStepState& step_state() const { return *state_; }
  // The routing bias of auxiliary-loss-free balancing (a view into model::RoutingBias's table).
  void set_routing_bias(at::Tensor bias) { routing_bias_ = std::move(bias); }

 private:
  // The expert frequencies f of the load-balancing loss, and the token count they cover.
  std::pair<at::Tensor, int64_t> expert_frequencies(const Routing& routing, int64_t tokens) const;

  Linear router_;
  GroupedExperts experts_;  // this rank's: global experts first_expert_ ..
  ExpertDispatcher dispatcher_;  // the copies to the ranks of their experts and back
  ExpertParallel ep_;
  int64_t first_expert_ = 0;
  std::optional<SwigluMlp> shared_;
  int64_t num_experts_ = 0, top_k_ = 0;
  RouterOptions router_options_;
  at::Tensor routing_bias_;  // fp32 [E] or undefined
  std::optional<double> capacity_factor_;
  bool global_scope_ = false;
  std::shared_ptr<MoeStepState> state_ = std::make_shared<MoeStepState>();
};

}  // namespace trainer::model
