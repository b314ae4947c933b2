#pragma once
// Internal to lib/estimate: the operations of our model replayed on a Timeline (see layer_model.h).
// Each forward function returns the tensors its backward needs (what autograd saved); backward
// functions consume the incoming gradient and return the outgoing one. Comments name the code in
// lib/model being replayed.
#include <vector>

#include "estimate/replay_ops.h"

namespace trainer::estimate::replay {

// The MoE feed-forward block (model/moe.cpp): router, top-k, sort by expert, gathered rows
// through each expert, weighted index_add back; with ep > 1 the dispatch and combine all-to-alls.
class MoeReplay : public ReplayOps {
 public:
  using ReplayOps::ReplayOps;

  // --- MoE layer (moe.cpp) --------------------------------------------------------------------
  struct MoeSaved {
    AttentionBlock attn;
    NormSaved norm2;
    Id norm2_out = Timeline::kNone, tokens = Timeline::kNone;
    Id probs = Timeline::kNone, top = Timeline::kNone, top_sum = Timeline::kNone;
    Id order = Timeline::kNone, token_of = Timeline::kNone;
    std::vector<MlpSaved> experts;
    Id cat_out = Timeline::kNone, cat_w = Timeline::kNone, y = Timeline::kNone, cat_idx = Timeline::kNone;
    MlpSaved shared;
    bool has_shared = false;
    Id recv = Timeline::kNone;  // expert-parallel: the dispatched tokens this rank received
  };
  // Rows of the local experts, split as evenly as counts allow.
  std::vector<int64_t> expert_split() const {
    std::vector<int64_t> rows(size_t(std::max<int64_t>(1, s_.local_experts)), 0);
    const int64_t total = s_.expert_rows, n = int64_t(rows.size());
    for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = total / n + (i < total % n ? 1 : 0);
    return rows;
  }
  // Rows this rank's tokens keep after the capacity cap (all of them when dropless); what comes
  // back from the experts and is weighted and summed.
  // Under sequence parallelism each tp rank routes its own part of the sequence (Tn tokens), the
  // shared experts gather the whole sequence like a dense MLP.
  int64_t kept_rows() const { return std::min(Tn() * s_.top_k, s_.ep > 1 ? Tn() * s_.top_k : s_.expert_rows); }
  Id moe_block_forward(Id n2, MoeSaved& m) {
    const int64_t N = Tn(), E = s_.experts, k = s_.top_k, R = N * k;  // this rank's routed rows
    const int64_t K = kept_rows();
    const Id tokens = n2;
    m.tokens = tokens;
    // Router (replicated linear, saves tokens), softmax in fp32 (saves its result).
    hold(tokens);
    const Id logits = gemm(N, E, H());
    Id logits32 = Timeline::kNone;
    if (e_ != kF32) logits32 = ew(N * E * kF32);
    m.probs = ew(N * E * kF32, 1);
    drop(logits);
    drop(logits32);
    m.top = alloc(N * k * kF32);  // topk values (saved by the division)
    const Id chosen = alloc(N * k * kI64);
    m.top_sum = ew(N * kF32);
    const Id weights = ew(N * k * kF32, 2);
    Id weights_e = Timeline::kNone;
    if (e_ != kF32) weights_e = ew(N * k * e_);
    drop(alloc(E * kI64));  // load-balancing loss: counts, frequencies, mean probabilities
    // Sort assignments by expert; token index and weight of each row.
    const Id sorted = alloc(R * kI64);
    m.order = alloc(R * kI64);
    drop(sorted);
    m.token_of = ew(R * kI64);
    const Id weight_of = ew(R * e_);  // index_select saves the order
    Id dispatched = Timeline::kNone;
    const auto split = expert_split();
    if (s_.ep > 1) {
      // Gather rows in expert order, all-to-all to the experts' ranks (dispatch).
      dispatched = ew(R * H() * e_);
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
      m.recv = alloc(s_.expert_rows * H() * e_);
      drop(dispatched);
    }
    std::vector<Id> outputs;
    for (int64_t rows : split) {
      if (rows == 0) continue;
      Id xe;
      if (s_.ep > 1) {
        xe = m.recv;  // experts read slices of the received buffer
        hold(xe);
      } else {
        xe = ew(rows * H() * e_);  // tokens.index_select(0, idx)
      }
      MlpSaved saved;
      outputs.push_back(mlp_forward(xe, xe, rows, s_.expert_ffn, saved));
      drop(xe);
      m.experts.push_back(saved);
    }
    Id combined = alloc(N * H() * e_);  // zeros_like(tokens)
    Id cat_local = Timeline::kNone;
    if (s_.ep > 1) {
      cat_local = ew(s_.expert_rows * H() * e_);
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);  // combine
      m.cat_out = alloc(K * H() * e_);
      drop(cat_local);
    } else {
      m.cat_out = ew(K * H() * e_);
    }
    m.cat_w = ew(K * e_);
    m.y = ew(K * H() * e_, 2);
    m.cat_idx = ew(K * kI64);
    const Id added = ew(N * H() * e_, 2);  // combined.index_add(0, idx, y)
    drop(combined);
    combined = added;
    for (Id out : outputs) drop(out);
    drop(weight_of);
    drop(weights);
    drop(weights_e);
    drop(chosen);
    if (s_.shared_ffn > 0) {
      m.has_shared = true;
      const Id in = gather_input(tokens);
      const Id sh = reduce_output(mlp_forward(in, tokens, T(), s_.shared_ffn, m.shared));
      if (in != tokens) drop(in);
      const Id sum = ew(N * H() * e_, 2);
      drop(combined);
      drop(sh);
      combined = sum;
    }
    return combined;
  }
  Id moe_block_backward(Id g, MoeSaved& m) {
    const int64_t N = Tn(), E = s_.experts, k = s_.top_k, R = N * k, K = kept_rows();
    Id tok_grad = Timeline::kNone;
    if (m.has_shared) {
      const Id gm = gather_grad_copy(g);
      tok_grad = mlp_backward(gm, m.shared, /*reduce=*/true);
      if (gm != g) drop(gm);
    }
    // index_add: the rows' gradient is the output gradient gathered by token.
    const Id gy = ew(K * H() * e_);
    drop(m.cat_idx);
    drop(m.y);
    // y = cat_out * w
    const Id gcat = ew(K * H() * e_, 2);
    const Id tmp = ew(K * H() * e_, 2);
    const Id gw = ew(K * e_);
    drop(tmp);
    drop(gy);
    drop(m.cat_w);
    drop(m.cat_out);
    Id grecv = Timeline::kNone;
    if (s_.ep > 1) {
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
      grecv = alloc(s_.expert_rows * H() * e_);
      drop(gcat);
    }
    const Id gsrc = s_.ep > 1 ? grecv : gcat;
    Id gdisp = Timeline::kNone;
    if (s_.ep > 1) gdisp = alloc(s_.expert_rows * H() * e_);
    for (auto it = m.experts.rbegin(); it != m.experts.rend(); ++it) {
      const Id gin = mlp_backward(gsrc, *it, /*reduce=*/false);
      if (s_.ep > 1) {
        drop(gin);  // written into the dispatched-gradient buffer
        continue;
      }
      const Id gt = ew(N * H() * e_, 2);  // index_select backward: scatter rows into [N, H]
      drop(gin);
      if (tok_grad == Timeline::kNone)
        tok_grad = gt;
      else
        accumulate(tok_grad, gt);
    }
    drop(gsrc);
    if (s_.ep > 1) {
      drop(m.recv);
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
      const Id back = alloc(R * H() * e_);
      drop(gdisp);
      const Id gt = ew(N * H() * e_, 2);
      drop(back);
      if (tok_grad == Timeline::kNone)
        tok_grad = gt;
      else
        accumulate(tok_grad, gt);
    }
    // Routing weights back to the router: small [N, k] and [N, E] tensors, then the router.
    const Id gwr = ew(N * k * kF32);
    drop(gw);
    const Id gprobs = ew(N * E * kF32);
    drop(gwr);
    drop(m.top);
    drop(m.top_sum);
    drop(m.order);
    drop(m.token_of);
    const Id glogits = ew(N * E * kF32, 2);
    drop(gprobs);
    drop(m.probs);
    const Id gr = linear_backward(glogits, N, E, H(), m.tokens);
    if (tok_grad == Timeline::kNone)
      tok_grad = gr;
    else
      accumulate(tok_grad, gr);
    return tok_grad;
  }
  struct MoeLayer {
    AttentionBlock attn;
    NormSaved norm2;
    MoeSaved moe;
    Id norm2_out = Timeline::kNone;
  };
  Id moe_forward_inner(Id x, MoeLayer& l) {
    const Id h = attention_forward(x, l.attn);
    const Id n2 = norm_forward(h, Tn(), l.norm2);
    l.norm2_out = n2;
    const Id y = moe_block_forward(n2, l.moe);
    drop(n2);  // the local reference (the router keeps the tokens)
    const Id out = ew(Tn() * H() * e_, 2);
    drop(y);
    drop(h);
    return out;
  }
  Id moe_backward_inner(Id g, MoeLayer& l) {
    const Id gn = moe_block_backward(g, l.moe);
    norm_backward(gn, l.norm2, g);
    return attention_backward(g, l.attn);
  }

  Id moe_nograd(Id x) {
    const int64_t N = Tn(), E = s_.experts, k = s_.top_k, R = N * k;
    const Id h = attention_nograd(x);
    const Id n2 = norm_nograd(h, Tn());
    const Id tokens = n2;
    const Id logits = gemm(N, E, H());
    const Id probs = ew(N * E * kF32);
    drop(logits);
    const Id top = alloc(N * k * kF32), chosen = alloc(N * k * kI64), weights = ew(N * k * kF32, 2);
    drop(top);
    const Id order = alloc(R * kI64), token_of = ew(R * kI64), weight_of = ew(R * e_);
    std::vector<Id> outputs;
    for (int64_t rows : expert_split()) {
      if (rows == 0) continue;
      const Id xe = ew(rows * H() * e_);
      outputs.push_back(mlp_nograd(xe, rows, s_.expert_ffn));
      drop(xe);
    }
    Id combined = alloc(N * H() * e_);
    const int64_t K = kept_rows();
    const Id cat_out = ew(K * H() * e_), cat_w = ew(K * e_);
    const Id y = ew(K * H() * e_, 2);
    drop(cat_out);
    drop(cat_w);
    const Id added = ew(N * H() * e_, 2);
    drop(combined);
    drop(y);
    combined = added;
    for (Id o : outputs) drop(o);
    for (Id t : {probs, chosen, weights, order, token_of, weight_of}) drop(t);
    if (s_.shared_ffn > 0) {
      const Id in = gather_input(tokens);
      const Id sh = reduce_output(mlp_nograd(in, T(), s_.shared_ffn));
      if (in != tokens) drop(in);
      const Id sum = ew(N * H() * e_, 2);
      drop(sh);
      drop(combined);
      combined = sum;
    }
    drop(n2);
    const Id out = ew(Tn() * H() * e_, 2);
    drop(combined);
    drop(h);
    return out;
  }

};

}  // namespace trainer::estimate::replay
