#pragma once
// Internal to lib/estimate: the operations of our model replayed on a Timeline (see layer_model.h).
// Each forward function returns the tensors its backward needs (what autograd saved); backward
// functions consume the incoming gradient and return the outgoing one. Comments name the code in
// lib/model being replayed.
#include <vector>

#include "estimate/replay_ops.h"

namespace trainer::estimate::replay {

// The MoE feed-forward block (model/moe.cpp): router, top-k, sort by expert, the rows through the
// grouped experts (model/grouped_experts.cpp), weighted index_add back; with ep > 1 the dispatch
// and combine all-to-alls, with etp > 1 the gather of the etp group's rows and the return of the
// partial outputs.
class MoeReplay : public ReplayOps {
 public:
  using ReplayOps::ReplayOps;

  // What the grouped experts saved for backward (grouped_experts.cpp).
  struct GroupedSaved {
    Id rows = Timeline::kNone, h1 = Timeline::kNone, h3 = Timeline::kNone;
    int64_t n = 0;
  };
  // --- MoE layer (moe.cpp) --------------------------------------------------------------------
  struct MoeSaved {
    AttentionBlock attn;
    NormSaved norm2;
    Id norm2_out = Timeline::kNone, tokens = Timeline::kNone;
    Id probs = Timeline::kNone, top = Timeline::kNone, top_sum = Timeline::kNone;
    Id order = Timeline::kNone, token_of = Timeline::kNone;
    GroupedSaved experts;
    Id cat_out = Timeline::kNone, cat_w = Timeline::kNone, y = Timeline::kNone, cat_idx = Timeline::kNone;
    MlpSaved shared;
    bool has_shared = false;
    Id recv = Timeline::kNone;  // expert-parallel: the dispatched tokens this rank received
  };
  // --- grouped experts (grouped_experts.cpp): one SwiGLU over every local expert's rows ---------
  // Rows the local experts compute on: what the ep exchange brought, from every etp rank.
  int64_t grouped_rows() const { return s_.expert_rows * s_.etp; }
  // x: [n, H] grouped by expert, saved. Returns the output [n, H] (a partial sum over etp).
  Id grouped_forward(Id x, int64_t n, GroupedSaved& g) {
    const int64_t width = s_.expert_ffn;
    g.n = n;
    g.rows = x;
    hold(x);
    g.h1 = gemm(n, width, H(), true);
    g.h3 = gemm(n, width, H(), true);
    const Id silu = ew(n * width * e_);
    const Id a = ew(n * width * e_, 2);
    drop(silu);
    const Id y = gemm(n, H(), width, true);
    drop(a);
    return y;
  }
  Id grouped_nograd(int64_t n) {
    const int64_t width = s_.expert_ffn;
    const Id h1 = gemm(n, width, H(), true), h3 = gemm(n, width, H(), true);
    const Id silu = ew(n * width * e_);
    const Id a = ew(n * width * e_, 2);
    drop(silu);
    drop(h1);
    drop(h3);
    const Id y = gemm(n, H(), width, true);
    drop(a);
    return y;
  }
  // go: the output gradient (not consumed). Returns the input gradient [n, H]; the weight
  // gradients go into the parameters' .grad one expert at a time.
  Id grouped_backward(Id go, GroupedSaved& g) {
    const int64_t n = g.n, width = s_.expert_ffn, act = n * width * e_;
    const Id da = gemm(n, width, H(), true);  // go W2
    const Id sig = ew(act);
    const Id silu = ew(act, 2);
    const Id dh3 = ew(act, 2);
    // dh1 = da * h3 * s (1 + h1 (1 - s)): one temporary, updated in place.
    const Id dsilu = ew(act);
    in_place(act, 3);
    drop(sig);
    const Id dh1 = ew(act, 2);
    in_place(act, 1);
    drop(dsilu);
    drop(da);
    const Id gx = gemm(n, H(), width, true);
    const Id gx3 = gemm(n, H(), width, true);
    accumulate(gx, gx3);
    // Weight gradients, projection by projection and expert by expert, each added into .grad.
    const Id a = ew(act, 2);  // silu * h3, for the down projection's gradient
    for (int w = 0; w < 3; ++w) {
      for (const int64_t rows : expert_split()) {
        const Id gw = gemm(w == 0 ? H() : width, w == 0 ? width : H(), rows * s_.etp, true);
        t_.costs().memory_bytes += 3.0 * double(width * H() * e_);
        drop(gw);
      }
      if (w == 0) drop(a);
    }
    for (Id t : {silu, dh1, dh3, g.h1, g.h3, g.rows}) drop(t);
    return gx;
  }
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
    // The kept rows in expert order (tokens.index_select), to the experts' ranks (dispatch).
    const Id sorted_rows = ew(K * H() * e_);
    Id rows = sorted_rows;
    if (s_.ep > 1) {
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
      m.recv = alloc(s_.expert_rows * H() * e_);
      drop(sorted_rows);
      rows = ew(s_.expert_rows * H() * e_);  // grouped by local expert
      drop(m.recv);
    }
    Id gathered = rows;
    if (s_.etp > 1) {
      // Every etp rank's rows (repeat, all-to-all), grouped by expert.
      const Id repeated = ew(grouped_rows() * H() * e_);
      comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows() * H() * e_);
      const Id arrived = alloc(grouped_rows() * H() * e_);
      drop(repeated);
      gathered = ew(grouped_rows() * H() * e_);
      drop(arrived);
      drop(rows);
    }
    Id expert_out = grouped_forward(gathered, grouped_rows(), m.experts);
    drop(gathered);
    if (s_.etp > 1) {
      // Partial outputs back to their rows' etp rank and summed there.
      const Id reordered = ew(grouped_rows() * H() * e_);
      drop(expert_out);
      comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows() * H() * e_);
      const Id back = alloc(grouped_rows() * H() * e_);
      drop(reordered);
      expert_out = ew(s_.expert_rows * H() * e_, double(s_.etp));
      drop(back);
    }
    Id combined = alloc(N * H() * e_);  // zeros_like(tokens)
    if (s_.ep > 1) {
      const Id arrival = ew(s_.expert_rows * H() * e_);  // back to arrival order
      drop(expert_out);
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);  // combine
      m.cat_out = alloc(K * H() * e_);
      drop(arrival);
    } else {
      m.cat_out = expert_out;
    }
    m.cat_w = ew(K * e_);
    m.y = ew(K * H() * e_, 2);
    m.cat_idx = ew(K * kI64);
    const Id added = ew(N * H() * e_, 2);  // combined.index_add(0, idx, y)
    drop(combined);
    combined = added;
    drop(weight_of);
    drop(weights);
    drop(weights_e);
    drop(chosen);
    if (s_.shared_ffn > 0) {
      m.has_shared = true;
      const Id in = gather_input(tokens);
      const Id sh = reduce_output(mlp_forward(in, tokens, T(), s_.shared_ffn, m.shared, /*lean_mlp=*/false));
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
    // Backward of the combine exchange, the etp return and the reorderings: each a new tensor.
    Id gexp = gcat;
    if (s_.ep > 1) {
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
      const Id garr = alloc(s_.expert_rows * H() * e_);
      drop(gcat);
      gexp = ew(s_.expert_rows * H() * e_);
      drop(garr);
    }
    if (s_.etp > 1) {
      const Id rep = ew(grouped_rows() * H() * e_);  // the sum's gradient to every part
      drop(gexp);
      comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows() * H() * e_);
      const Id garr = alloc(grouped_rows() * H() * e_);
      drop(rep);
      gexp = ew(grouped_rows() * H() * e_);
      drop(garr);
    }
    Id gin = grouped_backward(gexp, m.experts);
    drop(gexp);
    if (s_.etp > 1) {
      const Id garr = ew(grouped_rows() * H() * e_);
      drop(gin);
      comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows() * H() * e_);
      const Id back = alloc(grouped_rows() * H() * e_);
      drop(garr);
      gin = ew(s_.expert_rows * H() * e_, double(s_.etp));  // repeat's backward sums the copies
      drop(back);
    }
    if (s_.ep > 1) {
      const Id garr = ew(s_.expert_rows * H() * e_);
      drop(gin);
      comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
      gin = alloc(K * H() * e_);
      drop(garr);
    }
    // index_select backward: the rows scattered into [N, H].
    const Id gt = ew(N * H() * e_, 2);
    drop(gin);
    if (tok_grad == Timeline::kNone)
      tok_grad = gt;
    else
      accumulate(tok_grad, gt);
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
    const int64_t K = kept_rows();
    const Id sorted = ew(K * H() * e_);
    if (s_.ep > 1) comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
    if (s_.etp > 1) comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows() * H() * e_);
    const Id expert_out = grouped_nograd(grouped_rows());
    drop(sorted);
    if (s_.etp > 1) comm(CommKind::AllToAll, CommGroup::Etp, grouped_rows() * H() * e_);
    if (s_.ep > 1) comm(CommKind::AllToAll, CommGroup::Ep, R * H() * e_);
    Id combined = alloc(N * H() * e_);
    const Id cat_out = ew(K * H() * e_), cat_w = ew(K * e_);
    drop(expert_out);
    const Id y = ew(K * H() * e_, 2);
    drop(cat_out);
    drop(cat_w);
    const Id added = ew(N * H() * e_, 2);
    drop(combined);
    drop(y);
    combined = added;
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
