#pragma once
// The routing half of an MoE layer, free of dispatch: the top-k choice, the capacity rule, the
// load-balancing and z-losses. Each works on this rank's tokens and, where the tokens of one
// micro-batch are spread over ranks (sequence parallelism, context parallelism), on the group
// that holds them, so that every mesh makes the decisions one process would.
#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace trainer::model {

struct RouterOptions {
  int64_t top_k = 2;
  bool sigmoid = false;          // DeepSeek-V3's per-expert sigmoid scores instead of a softmax
  int64_t n_group = 1;           // group-limited routing: experts in n_group equal groups,
  int64_t topk_group = 1;        // of which each token may use the topk_group best
  bool normalize = true;         // renormalise the chosen scores over k
  double scaling = 1.0;          // routed_scaling_factor
};

struct Routing {
  // [N, E] fp32 router probabilities of the load-balancing loss: the softmax, or the sigmoid
  // scores normalised per token (Megatron's choice for sigmoid routers).
  at::Tensor probs;
  at::Tensor chosen;   // [N, k] int64 experts, best first
  at::Tensor scores;   // [N, k] fp32 selection scores of the chosen experts (no gradient)
  at::Tensor weights;  // [N, k] fp32 combine weights: the chosen scores (renormalised over k) x scaling
  // fp32 scalar: the smallest gap between a token's k-th and (k+1)-th selection score, +inf when
  // no expert is left out or there are no tokens. A gap near rounding error means the choice
  // could flip with summation order (reported so that a flip is recognised, not hidden).
  at::Tensor margin;
};

// Top-k routing of router logits [N, E] (any float type; computed in fp32). `bias` (fp32 [E], may
// be undefined) is added to the scores for the choice only (auxiliary-loss-free balancing).
Routing route(const at::Tensor& logits, const RouterOptions& options, const at::Tensor& bias = {});

// The capacity rule: each expert takes at most `capacity` of the token copies routed to it, the
// ones with the highest routing probability, ties to the smaller token key (position in sequence,
// then sample). It is applied over the tokens of the whole micro-batch: `group` (the ranks holding
// its other parts, or null) gathers every rank's scores first, so the drops are the same on every
// mesh. Returns bool [N * k]: whether each of this rank's copies (row-major over [N, k]) is kept.
at::Tensor capacity_keep(const Routing& routing, const at::Tensor& token_keys, int64_t capacity,
                         int64_t num_experts, comm::Communicator* group);

// This rank's part of the load-balancing loss N_E * sum_i f_i * P_i: f (fp32 [E], no gradient) are
// the expert frequencies already reduced over the ranks that share the statistics, `tokens` the
// token count over those ranks; P_i sums this rank's probabilities over `tokens`. The parts of the
// ranks sum to the loss (Switch Transformer / Megatron normalisation: 1 when balanced).
at::Tensor load_balancing_part(const at::Tensor& probs, const at::Tensor& f, int64_t tokens);

// The load-balancing loss of one set of tokens: probs [N, E], chosen [N, k].
at::Tensor load_balancing_loss(const at::Tensor& probs, const at::Tensor& chosen, int64_t num_experts);

// This rank's part of the router z-loss mean(logsumexp(logits)^2) over `tokens` tokens (ST-MoE).
at::Tensor z_loss_part(const at::Tensor& logits, int64_t tokens);

}  // namespace trainer::model
