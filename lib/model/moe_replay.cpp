#include "model/moe_replay.h"

#include <algorithm>
#include <numeric>

namespace trainer::model::replays {

namespace {

// Rows the local experts (grouped_experts.cpp) compute on: what the ep exchange brought, from every etp rank.
int64_t grouped_rows(Replay& r) { return r.s.expert_rows * r.s.etp; }

// Rows this rank's tokens keep after the capacity cap (all of them when dropless); what comes
// back from the experts and is weighted and summed.
// Under sequence parallelism each tp rank routes its own part of the sequence (Tn tokens), the
// shared experts gather the whole sequence like a dense MLP.
int64_t kept_rows(Replay& r) { return std::min(r.Tn() * r.s.top_k, r.s.ep > 1 ? r.Tn() * r.s.top_k : r.s.expert_rows); }

}  // namespace

Id moe_block_forward(Replay& r, Id n2, MoeSaved& m) {
  const int64_t N = r.Tn(), E = r.s.experts, k = r.s.top_k, R = N * k;  // this rank's routed rows
  const int64_t K = kept_rows(r);
  const Id tokens = n2;
  m.tokens = tokens;
  // Router (replicated linear, saves tokens), softmax in fp32 (saves its result).
  r.hold(tokens);
  const Id logits = r.gemm(N, E, r.H());
  Id logits32 = Timeline::kNone;
  if (r.e != kF32) logits32 = r.ew(N * E * kF32);
  m.probs = r.ew(N * E * kF32, 1);
  r.drop(logits);
  r.drop(logits32);
  m.top = r.alloc(N * k * kF32);  // topk values (saved by the division)
  const Id chosen = r.alloc(N * k * kI64);
  m.top_sum = r.ew(N * kF32);
  const Id weights = r.ew(N * k * kF32, 2);
  Id weights_e = Timeline::kNone;
  if (r.e != kF32) weights_e = r.ew(N * k * r.e);
  r.drop(r.alloc(E * kI64));  // load-balancing loss: counts, frequencies, mean probabilities
  // Sort assignments by expert; token index and weight of each row.
  const Id sorted = r.alloc(R * kI64);
  m.order = r.alloc(R * kI64);
  r.drop(sorted);
  m.token_of = r.ew(R * kI64);
  const Id weight_of = r.ew(R * r.e);  // index_select saves the order
  // The kept rows in expert order (tokens.index_select), to the experts' ranks (dispatch).
  const Id sorted_rows = r.ew(K * r.H() * r.e);
  Id rows = sorted_rows;
  if (r.s.ep > 1) {
    r.comm(CommKind::AllToAll, CommGroup::Ep, R * r.H() * r.e);
    m.recv = r.alloc(r.s.expert_rows * r.H() * r.e);
    r.drop(sorted_rows);
    rows = r.ew(r.s.expert_rows * r.H() * r.e);  // grouped by local expert
    r.drop(m.recv);
  }
  Id gathered = rows;
  if (r.s.etp > 1) {
    // Every etp rank's rows (repeat, all-to-all), grouped by expert.
    const Id repeated = r.ew(grouped_rows(r) * r.H() * r.e);
    r.comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows(r) * r.H() * r.e);
    const Id arrived = r.alloc(grouped_rows(r) * r.H() * r.e);
    r.drop(repeated);
    gathered = r.ew(grouped_rows(r) * r.H() * r.e);
    r.drop(arrived);
    r.drop(rows);
  }
  Id expert_out = grouped_forward(r, gathered, grouped_rows(r), m.experts);
  r.drop(gathered);
  if (r.s.etp > 1) {
    // Partial outputs back to their rows' etp rank and summed there.
    const Id reordered = r.ew(grouped_rows(r) * r.H() * r.e);
    r.drop(expert_out);
    r.comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows(r) * r.H() * r.e);
    const Id back = r.alloc(grouped_rows(r) * r.H() * r.e);
    r.drop(reordered);
    expert_out = r.ew(r.s.expert_rows * r.H() * r.e, double(r.s.etp));
    r.drop(back);
  }
  Id combined = r.alloc(N * r.H() * r.e);  // zeros_like(tokens)
  if (r.s.ep > 1) {
    const Id arrival = r.ew(r.s.expert_rows * r.H() * r.e);  // back to arrival order
    r.drop(expert_out);
    r.comm(CommKind::AllToAll, CommGroup::Ep, R * r.H() * r.e);  // combine
    m.cat_out = r.alloc(K * r.H() * r.e);
    r.drop(arrival);
  } else {
    m.cat_out = expert_out;
  }
  m.cat_w = r.ew(K * r.e);
  m.y = r.ew(K * r.H() * r.e, 2);
  m.cat_idx = r.ew(K * kI64);
  const Id added = r.ew(N * r.H() * r.e, 2);  // combined.index_add(0, idx, y)
  r.drop(combined);
  combined = added;
  r.drop(weight_of);
  r.drop(weights);
  r.drop(weights_e);
  r.drop(chosen);
  if (r.s.shared_ffn > 0) {
    m.has_shared = true;
    const Id in = gather_input(r, tokens, /*gemms=*/2);
    const Id sh = mlp_forward(r, in, tokens, r.T(), r.s.shared_ffn, m.shared, /*lean_mlp=*/false);
    if (in != tokens) r.drop(in);
    const Id sum = r.ew(N * r.H() * r.e, 2);
    r.drop(combined);
    r.drop(sh);
    combined = sum;
  }
  return combined;
}

Id moe_block_backward(Replay& r, Id g, MoeSaved& m) {
  const int64_t N = r.Tn(), E = r.s.experts, k = r.s.top_k, R = N * k, K = kept_rows(r);
  Id tok_grad = Timeline::kNone;
  if (m.has_shared) {
    const Id gm = gather_grad_copy(r, g);
    tok_grad = mlp_backward(r, gm, m.shared, /*reduce=*/true);
    if (gm != g) r.drop(gm);
  }
  // index_add: the rows' gradient is the output gradient gathered by token.
  const Id gy = r.ew(K * r.H() * r.e);
  r.drop(m.cat_idx);
  r.drop(m.y);
  // y = cat_out * w
  const Id gcat = r.ew(K * r.H() * r.e, 2);
  const Id tmp = r.ew(K * r.H() * r.e, 2);
  const Id gw = r.ew(K * r.e);
  r.drop(tmp);
  r.drop(gy);
  r.drop(m.cat_w);
  r.drop(m.cat_out);
  // Backward of the combine exchange, the etp return and the reorderings: each a new tensor.
  Id gexp = gcat;
  if (r.s.ep > 1) {
    r.comm(CommKind::AllToAll, CommGroup::Ep, R * r.H() * r.e);
    const Id garr = r.alloc(r.s.expert_rows * r.H() * r.e);
    r.drop(gcat);
    gexp = r.ew(r.s.expert_rows * r.H() * r.e);
    r.drop(garr);
  }
  if (r.s.etp > 1) {
    const Id rep = r.ew(grouped_rows(r) * r.H() * r.e);  // the sum's gradient to every part
    r.drop(gexp);
    r.comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows(r) * r.H() * r.e);
    const Id garr = r.alloc(grouped_rows(r) * r.H() * r.e);
    r.drop(rep);
    gexp = r.ew(grouped_rows(r) * r.H() * r.e);
    r.drop(garr);
  }
  Id gin = grouped_backward(r, gexp, m.experts);
  r.drop(gexp);
  if (r.s.etp > 1) {
    const Id garr = r.ew(grouped_rows(r) * r.H() * r.e);
    r.drop(gin);
    r.comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows(r) * r.H() * r.e);
    const Id back = r.alloc(grouped_rows(r) * r.H() * r.e);
    r.drop(garr);
    gin = r.ew(r.s.expert_rows * r.H() * r.e, double(r.s.etp));  // repeat's backward sums the copies
    r.drop(back);
  }
  if (r.s.ep > 1) {
    const Id garr = r.ew(r.s.expert_rows * r.H() * r.e);
    r.drop(gin);
    r.comm(CommKind::AllToAll, CommGroup::Ep, R * r.H() * r.e);
    gin = r.alloc(K * r.H() * r.e);
    r.drop(garr);
  }
  // index_select backward: the rows scattered into [N, H].
  const Id gt = r.ew(N * r.H() * r.e, 2);
  r.drop(gin);
  if (tok_grad == Timeline::kNone)
    tok_grad = gt;
  else
    r.accumulate(tok_grad, gt);
  // Routing weights back to the router: small [N, k] and [N, E] tensors, then the router.
  const Id gwr = r.ew(N * k * kF32);
  r.drop(gw);
  const Id gprobs = r.ew(N * E * kF32);
  r.drop(gwr);
  r.drop(m.top);
  r.drop(m.top_sum);
  r.drop(m.order);
  r.drop(m.token_of);
  const Id glogits = r.ew(N * E * kF32, 2);
  r.drop(gprobs);
  r.drop(m.probs);
  const Id gr = linear_backward(r, glogits, N, E, r.H(), m.tokens);
  if (tok_grad == Timeline::kNone)
    tok_grad = gr;
  else
    r.accumulate(tok_grad, gr);
  return tok_grad;
}

Id moe_block_nograd(Replay& r, Id tokens) {
  const int64_t N = r.Tn(), E = r.s.experts, k = r.s.top_k, R = N * k;
  const Id logits = r.gemm(N, E, r.H());
  const Id probs = r.ew(N * E * kF32);
  r.drop(logits);
  const Id top = r.alloc(N * k * kF32), chosen = r.alloc(N * k * kI64), weights = r.ew(N * k * kF32, 2);
  r.drop(top);
  const Id order = r.alloc(R * kI64), token_of = r.ew(R * kI64), weight_of = r.ew(R * r.e);
  const int64_t K = kept_rows(r);
  const Id sorted = r.ew(K * r.H() * r.e);
  if (r.s.ep > 1) r.comm(CommKind::AllToAll, CommGroup::Ep, R * r.H() * r.e);
  if (r.s.etp > 1) r.comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows(r) * r.H() * r.e);
  const Id expert_out = grouped_nograd(r, grouped_rows(r));
  r.drop(sorted);
  if (r.s.etp > 1) r.comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows(r) * r.H() * r.e);
  if (r.s.ep > 1) r.comm(CommKind::AllToAll, CommGroup::Ep, R * r.H() * r.e);
  Id combined = r.alloc(N * r.H() * r.e);
  const Id cat_out = r.ew(K * r.H() * r.e), cat_w = r.ew(K * r.e);
  r.drop(expert_out);
  const Id y = r.ew(K * r.H() * r.e, 2);
  r.drop(cat_out);
  r.drop(cat_w);
  const Id added = r.ew(N * r.H() * r.e, 2);
  r.drop(combined);
  r.drop(y);
  combined = added;
  for (Id t : {probs, chosen, weights, order, token_of, weight_of}) r.drop(t);
  if (r.s.shared_ffn > 0) {
    const Id in = gather_input(r, tokens, /*gemms=*/2);
    const Id sh = mlp_nograd(r, in, r.T(), r.s.shared_ffn);
    if (in != tokens) r.drop(in);
    const Id sum = r.ew(N * r.H() * r.e, 2);
    r.drop(sh);
    r.drop(combined);
    combined = sum;
  }
  return combined;
}

}  // namespace trainer::model::replays
