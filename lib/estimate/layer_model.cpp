#include "estimate/layer_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace trainer::estimate {

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw std::invalid_argument(fmt::format("unknown recompute mode \"{}\"", name));
}

namespace {

using Id = Timeline::Id;
constexpr int64_t kF32 = 4;
constexpr int64_t kI64 = 8;

// Emits the operations of our model on a Timeline. Each forward function returns the tensors its
// backward needs (those autograd saved); the backward functions consume the incoming gradient
// and return the outgoing one. Comments name the code in lib/model being replayed.
class Replay {
 public:
  Replay(Timeline& t, const RankShape& s) : t_(t), s_(s), e_(s.element_bytes()) {}

  // --- primitives -----------------------------------------------------------------------------
  // A memory-bound kernel writing `bytes` and reading `reads` times as much.
  Id ew(int64_t bytes, double reads = 1) {
    auto& c = t_.costs();
    c.memory_bytes += double(bytes) * (1 + reads);
    c.memory_kernels += 1;
    return t_.alloc(bytes);
  }
  // y[m,n] = x[m,k] w[n,k]^T in the model dtype.
  Id gemm(int64_t m, int64_t n, int64_t k) {
    t_.costs().gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n + m * n) * e_)});
    return t_.alloc(m * n * e_);
  }
  void gemm_cost(int64_t m, int64_t n, int64_t k) {
    t_.costs().gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n + m * n) * e_)});
  }
  void comm(CommKind kind, CommGroup group, int64_t bytes, bool overlapped = false) {
    t_.costs().comms.push_back(CommOp{kind, group, double(bytes), overlapped});
  }
  void drop(Id id) { t_.drop(id); }
  void hold(Id id) { t_.hold(id); }
  Id alloc(int64_t bytes) { return t_.alloc(bytes); }
  // A gradient accumulated in place into `into`: `from` is freed.
  void accumulate(Id into, Id from) {
    t_.costs().memory_bytes += 3.0 * double(t_.bytes(from));
    t_.costs().memory_kernels += 1;
    t_.drop(from);
  }

  bool sp() const { return s_.sequence_parallel && s_.tp > 1; }
  int64_t T() const { return s_.tokens(); }
  int64_t Tn() const { return s_.norm_tokens(); }
  int64_t H() const { return s_.hidden; }

  // --- linear layers: save the input, produce weight and input gradients ----------------------
  // Backward of y = x W^T (W [n,k], x [m,k]): the weight gradient is a new tensor accumulated
  // into the persistent .grad (AccumulateGrad adds in place, then frees it); the input gradient
  // is new. `saved` is the input the linear holds, released after.
  Id linear_backward(Id g, int64_t m, int64_t n, int64_t k, Id saved, bool drop_grad = true) {
    const Id gw = gemm(n, k, m);  // dW = g^T x
    const Id gx = gemm(m, k, n);  // dx = g W
    if (drop_grad) drop(g);
    drop(saved);
    t_.costs().memory_bytes += 3.0 * double(n * k * e_);  // .grad += dW
    drop(gw);
    return gx;
  }

  // --- RMSNorm (layers.cpp): x32 = x.float(); normed = x32 * rsqrt(mean(x32^2) + eps);
  //     out = w * normed.to(dtype) -----------------------------------------------------------
  struct NormSaved {
    Id x32 = Timeline::kNone, rs = Timeline::kNone, normed = Timeline::kNone;
    int64_t tokens = 0;
  };
  Id norm_forward(Id x, int64_t tokens, NormSaved& saved) {
    const int64_t n = tokens * H();
    saved.tokens = tokens;
    if (e_ == kF32) {
      saved.x32 = x;
      hold(x);  // saved by pow and by the mul
    } else {
      saved.x32 = ew(n * kF32);  // the fp32 copy, saved
    }
    const Id pow = ew(n * kF32);
    const Id mean = ew(tokens * kF32);
    drop(pow);
    const Id add = ew(tokens * kF32);
    drop(mean);
    saved.rs = ew(tokens * kF32);  // rsqrt, saved
    drop(add);
    Id normed = ew(n * kF32, 2);
    if (e_ != kF32) {
      const Id cast = ew(n * e_);
      drop(normed);
      normed = cast;
    }
    saved.normed = normed;  // saved by the weight mul
    return ew(n * e_, 2);
  }
  // Returns the gradient of x. With `resid` (the residual stream's gradient buffer) the result
  // is accumulated into it in place, as autograd's input buffer does, and `resid` is returned.
  Id norm_backward(Id g, const NormSaved& saved, Id resid) {
    const int64_t n = saved.tokens * H();
    Id gn = ew(n * e_, 2);         // g * w
    const Id tmp = ew(n * e_, 2);  // g * normed, summed into the weight gradient
    const Id gw = ew(H() * e_);
    drop(tmp);
    drop(saved.normed);
    drop(g);
    drop(gw);
    if (e_ != kF32) {
      const Id g32 = ew(n * kF32);
      drop(gn);
      gn = g32;
    }
    const Id gx1 = ew(n * kF32, 2);   // gn * rs
    const Id tmp2 = ew(n * kF32, 2);  // gn * x32, summed for rs
    const Id grs = ew(saved.tokens * kF32);
    drop(tmp2);
    drop(gn);
    const bool into_resid = resid != Timeline::kNone && e_ == kF32;
    Id acc = gx1;
    if (into_resid) {
      accumulate(resid, gx1);
      acc = resid;
    }
    const Id gpow = ew(n * kF32);  // through rsqrt, add, mean
    drop(grs);
    drop(saved.rs);
    // pow backward: grad * (2 * x.pow(1)), three temporaries alive together.
    const Id ta = ew(n * kF32);
    const Id tb = ew(n * kF32);
    const Id tc = ew(n * kF32, 2);
    drop(ta);
    drop(tb);
    drop(gpow);
    accumulate(acc, tc);
    drop(saved.x32);
    if (e_ == kF32) return acc;
    const Id cast = ew(n * e_);  // x.float() backward
    drop(acc);
    if (resid == Timeline::kNone) return cast;
    accumulate(resid, cast);
    return resid;
  }

  // --- rotary (rotary.cpp): x * cos + cat(-x2, x1) * sin; cos and sin need no gradient, so the
  //     muls save only them and the input is freed once rotated -----------------------------------
  Id rope_forward(Id x, int64_t bytes) {
    const Id xc = ew(bytes, 2);
    const Id neg = ew(bytes / 2);
    const Id cat = ew(bytes);
    drop(neg);
    const Id rs = ew(bytes, 2);
    drop(cat);
    const Id out = ew(bytes, 2);
    drop(xc);
    drop(rs);
    drop(x);
    return out;
  }
  Id rope_backward(Id g, int64_t bytes) {
    const Id a = ew(bytes, 2);      // g * sin
    const Id b = ew(bytes / 2);     // neg
    const Id c = ew(bytes);         // slice backward
    drop(a);
    const Id d = ew(bytes, 2);
    drop(b);
    drop(c);
    const Id r = ew(bytes, 2);      // all paths summed (g * cos + ...)
    drop(d);
    drop(g);
    return r;
  }

  // --- attention core: scaled_dot_product_attention (flash: saves q, k, v, out and the fp32
  //     log-sum-exp; no s x s matrix) --------------------------------------------------------
  int64_t q_bytes() const { return T() * s_.q_heads * s_.head_dim * e_; }
  int64_t kv_bytes() const { return T() * s_.kv_heads * s_.head_dim * e_; }
  int64_t lse_bytes() const { return s_.micro_batch * s_.q_heads * s_.seq * kF32; }
  // CPU flash attention (aten/native/cpu/FlashAttentionKernel.cpp) keeps per-thread blocks:
  // q split 32/64/256 by length, kv split 512.
  int64_t q_split() const { return std::min<int64_t>(s_.seq >= 768 ? 256 : s_.seq >= 192 ? 64 : 32, s_.seq); }
  int64_t kv_split() const { return std::min<int64_t>(512, s_.seq); }
  double attention_flops_forward() const {
    // QK^T and AV: 4 b heads s^2 d, half of it under the causal mask. With cp, each rank's two
    // chunks see on average half of the whole sequence: the same total split cp ways.
    const double full = 4.0 * double(s_.micro_batch) * double(s_.q_heads) * double(s_.seq) *
                        double(s_.seq * s_.cp) * double(s_.head_dim);
    return full / 2.0;
  }
  void cp_forward_comm() {
    if (s_.cp <= 1) return;
    if (s_.ulysses) {
      comm(CommKind::AllToAll, CommGroup::Cp, q_bytes() + 2 * kv_bytes());
      comm(CommKind::AllToAll, CommGroup::Cp, q_bytes());
    } else {
      // Ring: every rank passes its K and V block around the cp ranks while computing.
      comm(CommKind::SendRecv, CommGroup::Cp, (s_.cp - 1) * 2 * kv_bytes(), /*overlapped=*/true);
    }
  }
  struct AttentionSaved {
    Id q = Timeline::kNone, k = Timeline::kNone, v = Timeline::kNone, out = Timeline::kNone, lse = Timeline::kNone;
  };
  // Returns out; `keep_lse` false when the core runs without autograd (selective recompute).
  Id sdpa_forward(bool keep_lse, Id& lse) {
    const Id out = alloc(q_bytes());
    lse = alloc(lse_bytes());
    t_.costs().attention_flops += attention_flops_forward();
    if (s_.cp > 1 && !s_.ulysses) {
      // Ring attention: the K/V blocks in flight (receive buffers, double-buffered).
      const Id ring = alloc(2 * kv_bytes());
      drop(ring);
    }
    if (s_.device == Device::Cpu) {
      const int64_t qs = q_split(), kvs = kv_split();
      int64_t ws = s_.cpu_threads * (qs * kvs + 2 * qs + qs * s_.head_dim) * kF32;
      if (e_ != kF32) ws += s_.cpu_threads * qs * kvs * e_;
      drop(alloc(ws));
    }
    cp_forward_comm();
    if (!keep_lse) {
      drop(lse);
      lse = Timeline::kNone;
    }
    return out;
  }
  // Consumes the gradient of out and releases q, k, v, out, lse; returns dq, dk, dv.
  void sdpa_backward(Id g, const AttentionSaved& a, Id& dq, Id& dk, Id& dv) {
    dq = alloc(q_bytes());
    dk = alloc(kv_bytes());
    dv = alloc(kv_bytes());
    t_.costs().attention_flops += 2.5 * attention_flops_forward();  // flash backward ~ 2.5x forward
    if (s_.device == Device::Cpu) {
      const int64_t qs = q_split(), kvs = kv_split();
      int64_t ws = s_.cpu_threads * 2 * qs * kvs * kF32;
      if (e_ != kF32) ws += s_.cpu_threads * (2 * qs * kvs * e_ + qs * s_.head_dim * kF32);
      drop(alloc(ws));
    } else {
      // FlashAttention-2 backward: fp32 dq accumulator and softmax row sums; with grouped-query
      // attention dk, dv per query head before the group sum.
      const Id acc = alloc(T() * s_.q_heads * s_.head_dim * kF32 + lse_bytes());
      Id expand = Timeline::kNone;
      if (s_.q_heads != s_.kv_heads) expand = alloc(2 * q_bytes());
      drop(acc);
      drop(expand);
    }
    if (s_.cp > 1) {
      if (s_.ulysses) {
        comm(CommKind::AllToAll, CommGroup::Cp, q_bytes());
        comm(CommKind::AllToAll, CommGroup::Cp, q_bytes() + 2 * kv_bytes());
      } else {
        const Id ring = alloc(2 * kv_bytes() + 2 * kv_bytes() / e_ * kF32);  // K/V in flight, dK/dV accumulators
        drop(ring);
        comm(CommKind::SendRecv, CommGroup::Cp, (s_.cp - 1) * 4 * kv_bytes(), /*overlapped=*/true);
      }
    }
    drop(g);
    drop(a.k);
    drop(a.q);
    drop(a.v);
    drop(a.lse);
    drop(a.out);
  }

  // --- tensor-parallel boundaries -------------------------------------------------------------
  // Input of a column-parallel block: with sp, all-gather the norm output (the gathered copy is
  // not saved: backward gathers again, as Megatron does); with tp only, the input is replicated.
  Id gather_input(Id x) {
    if (!sp()) return x;
    comm(CommKind::AllGather, CommGroup::Tp, T() * H() * e_);
    return alloc(T() * H() * e_);
  }
  // Output of a row-parallel block: all-reduce (tp) or reduce-scatter (sp) of the partial sums.
  Id reduce_output(Id y) {
    if (s_.tp <= 1) return y;
    if (!sp()) {
      comm(CommKind::AllReduce, CommGroup::Tp, T() * H() * e_);
      return y;
    }
    comm(CommKind::ReduceScatter, CommGroup::Tp, T() * H() * e_);
    const Id r = alloc(Tn() * H() * e_);
    drop(y);
    return r;
  }
  // Their conjugates in backward.
  Id gather_grad(Id g) {  // backward of reduce_output
    if (!sp()) return g;
    comm(CommKind::AllGather, CommGroup::Tp, T() * H() * e_);
    const Id r = alloc(T() * H() * e_);
    drop(g);
    return r;
  }
  Id reduce_grad(Id g) {  // backward of gather_input
    if (s_.tp <= 1) return g;
    if (!sp()) {
      comm(CommKind::AllReduce, CommGroup::Tp, T() * H() * e_);
      return g;
    }
    comm(CommKind::ReduceScatter, CommGroup::Tp, T() * H() * e_);
    const Id r = alloc(Tn() * H() * e_);
    drop(g);
    return r;
  }

  // --- attention block (attention.cpp) ------------------------------------------------------
  struct AttentionBlock {
    NormSaved norm;
    Id norm_out = Timeline::kNone;  // saved by q, k, v projections
    AttentionSaved core;
    Id h = Timeline::kNone;         // x + attention: the residual stream
  };
  // x: the layer input [Tn, H]. Returns h = x + o_proj(attention(norm(x))).
  Id attention_forward(Id x, AttentionBlock& a) {
    const Id n1 = norm_forward(x, Tn(), a.norm);
    a.norm_out = n1;
    const Id in = gather_input(n1);
    const int64_t qd = s_.q_heads * s_.head_dim, kvd = s_.kv_heads * s_.head_dim;
    const Id q = gemm(T(), qd, H());
    const Id k = gemm(T(), kvd, H());
    const Id v = gemm(T(), kvd, H());
    hold(n1);
    hold(n1);  // three projections save the (sharded) input; the local reference is the third
    if (in != n1) drop(in);
    a.core.q = rope_forward(q, q_bytes());
    a.core.k = rope_forward(k, kv_bytes());
    a.core.v = v;
    Id lse = Timeline::kNone;
    if (s_.recompute == Recompute::Selective) {
      // recompute(core, {q, k, v}): saves q, k, v; the core runs without autograd.
      a.core.out = sdpa_forward(/*keep_lse=*/false, lse);
    } else {
      a.core.out = sdpa_forward(/*keep_lse=*/true, lse);
    }
    a.core.lse = lse;
    const Id o = reduce_output(gemm(T(), H(), qd));  // o_proj saves its input (out)
    // Without recompute the flash node saves out too; with selective recompute only o_proj does.
    if (s_.recompute != Recompute::Selective) hold(a.core.out);
    a.h = ew(Tn() * H() * e_, 2);  // h = x + o
    drop(o);
    return a.h;
  }
  // g: gradient of h (the residual gradient, accumulated in place). Returns the gradient of the
  // layer input (the same buffer after accumulation) and releases the block's saved tensors.
  Id attention_backward(Id g, AttentionBlock& a) {
    const int64_t qd = s_.q_heads * s_.head_dim, kvd = s_.kv_heads * s_.head_dim;
    // o_proj: its input gradient is the gradient of the attention output.
    const Id go = gather_grad_copy(g);
    const Id gout = linear_backward(go, T(), H(), qd, a.core.out, /*drop_grad=*/go != g);
    if (s_.recompute == Recompute::Selective) {
      // Recompute the core with autograd (out and lse saved again), then its backward.
      Id lse = Timeline::kNone;
      a.core.out = sdpa_forward(/*keep_lse=*/true, lse);
      a.core.lse = lse;
    }
    Id dq, dk, dv;
    sdpa_backward(gout, a.core, dq, dk, dv);
    const Id gk = rope_backward(dk, kv_bytes());
    const Id gq = rope_backward(dq, q_bytes());
    // v, k, q projections (reverse order of creation); the input gradients are summed.
    const Id in = sp() ? alloc(T() * H() * e_) : Timeline::kNone;  // re-gathered input (sp)
    if (in != Timeline::kNone) comm(CommKind::AllGather, CommGroup::Tp, T() * H() * e_);
    const Id gin_v = linear_backward(dv, T(), kvd, H(), Timeline::kNone);
    const Id gin_k = linear_backward(gk, T(), kvd, H(), Timeline::kNone);
    const Id sum = ew(T() * H() * e_, 2);
    drop(gin_v);
    drop(gin_k);
    const Id gin_q = linear_backward(gq, T(), qd, H(), Timeline::kNone);
    drop(a.norm_out);
    drop(a.norm_out);
    drop(a.norm_out);
    drop(in);
    accumulate(sum, gin_q);
    const Id gn = reduce_grad(sum);
    return norm_backward(gn, a.norm, g);
  }
  // With sp the row-parallel output's gradient is all-gathered into a new buffer; otherwise the
  // residual gradient itself feeds the projection.
  Id gather_grad_copy(Id g) {
    if (!sp()) return g;
    comm(CommKind::AllGather, CommGroup::Tp, T() * H() * e_);
    return alloc(T() * H() * e_);
  }

  // --- SwiGLU MLP (layers.cpp): down(silu(gate(x)) * up(x)) ------------------------------------
  struct MlpSaved {
    Id in = Timeline::kNone, gate = Timeline::kNone, silu = Timeline::kNone, up = Timeline::kNone,
       mul = Timeline::kNone;
    int64_t rows = 0, width = 0;
    bool regather = false;
  };
  // x [rows, H] (already gathered when sp); `saved` is what gate and up keep for backward (the
  // sharded input with sp, regathered in backward); returns the (unreduced) output [rows, H].
  Id mlp_forward(Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m) {
    m.rows = rows;
    m.width = width;
    m.in = saved;
    m.regather = saved != x;
    hold(saved);
    hold(saved);
    m.gate = gemm(rows, width, H());
    m.silu = ew(rows * width * e_);
    m.up = gemm(rows, width, H());
    m.mul = ew(rows * width * e_, 2);
    return gemm(rows, H(), width);
  }
  // g: gradient of the output [rows, H] (not consumed). Returns the gradient of the input.
  Id mlp_backward(Id g, MlpSaved& m) {
    const int64_t rows = m.rows, width = m.width, act = rows * width * e_;
    Id regathered = Timeline::kNone;
    if (m.regather) {
      comm(CommKind::AllGather, CommGroup::Tp, rows * H() * e_);
      regathered = alloc(rows * H() * e_);
    }
    const Id gmul = linear_backward(g, rows, H(), width, m.mul, /*drop_grad=*/false);
    const Id gsilu = ew(act, 2);  // g * up
    const Id gup = ew(act, 2);    // g * silu
    drop(gmul);
    drop(m.silu);
    drop(m.up);
    const Id gin_up = linear_backward(gup, rows, width, H(), Timeline::kNone);
    const Id ggate = ew(act, 2);  // silu backward
    drop(gsilu);
    drop(m.gate);
    const Id gin_gate = linear_backward(ggate, rows, width, H(), Timeline::kNone);
    drop(m.in);
    drop(m.in);
    drop(regathered);
    const Id sum = ew(rows * H() * e_, 2);
    drop(gin_gate);
    drop(gin_up);
    return sum;
  }

  // --- dense decoder layer (transformer.cpp DecoderLayer) -----------------------------------
  struct DenseLayer {
    AttentionBlock attn;
    NormSaved norm2;
    Id norm2_out = Timeline::kNone;
    MlpSaved mlp;
    Id input = Timeline::kNone;  // saved by recompute(full)
    Id output = Timeline::kNone;
  };
  Id dense_forward_inner(Id x, DenseLayer& l) {
    const Id h = attention_forward(x, l.attn);
    const Id n2 = norm_forward(h, Tn(), l.norm2);
    l.norm2_out = n2;
    const Id in = gather_input(n2);
    const Id down = reduce_output(mlp_forward(in, n2, T(), s_.ffn, l.mlp));
    if (in != n2) drop(in);
    drop(n2);  // the local reference; gate and up keep it
    const Id out = ew(Tn() * H() * e_, 2);  // h + mlp
    drop(down);
    drop(h);  // DecoderLayer::forward's local h (in fp32 still saved by the norm)
    return out;
  }
  Id dense_backward_inner(Id g, DenseLayer& l) {
    // The residual passes g on unchanged; the MLP branch's input gradient comes back through norm2.
    const Id gm = gather_grad_copy(g);
    Id gn = mlp_backward(gm, l.mlp);
    if (gm != g) drop(gm);
    gn = reduce_grad(gn);
    norm_backward(gn, l.norm2, g);
    return attention_backward(g, l.attn);
  }

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
  Id moe_block_forward(Id n2, MoeSaved& m) {
    const int64_t N = T(), E = s_.experts, k = s_.top_k, R = N * k;  // this rank's routed rows
    const Id tokens = gather_input(n2);
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
      m.cat_out = alloc(R * H() * e_);
      drop(cat_local);
    } else {
      m.cat_out = ew(R * H() * e_);
    }
    m.cat_w = ew(R * e_);
    m.y = ew(R * H() * e_, 2);
    m.cat_idx = ew(R * kI64);
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
      const Id sh = mlp_forward(tokens, tokens, N, s_.shared_ffn, m.shared);
      const Id sum = ew(N * H() * e_, 2);
      drop(combined);
      drop(sh);
      combined = sum;
    }
    if (sp()) drop(tokens);  // the gathered tokens' local reference (the router keeps them)
    return reduce_output(combined);
  }
  Id moe_block_backward(Id g, MoeSaved& m) {
    const int64_t N = T(), E = s_.experts, k = s_.top_k, R = N * k;
    const Id gt_full = gather_grad_copy(g);
    Id tok_grad = Timeline::kNone;
    if (m.has_shared) tok_grad = mlp_backward(gt_full, m.shared);
    // index_add: the rows' gradient is the output gradient gathered by token.
    const Id gy = ew(R * H() * e_);
    drop(m.cat_idx);
    drop(m.y);
    // y = cat_out * w
    const Id gcat = ew(R * H() * e_, 2);
    const Id tmp = ew(R * H() * e_, 2);
    const Id gw = ew(R * e_);
    drop(tmp);
    drop(gy);
    drop(m.cat_w);
    drop(m.cat_out);
    if (gt_full != g) drop(gt_full);
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
      const Id gin = mlp_backward(gsrc, *it);
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
    return reduce_grad(tok_grad);
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

  // --- without autograd (the forward of recompute(full)): nothing is saved, every tensor is
  //     freed once its consumer has run ------------------------------------------------------
  Id norm_nograd(Id x, int64_t tokens) {
    const int64_t n = tokens * H();
    const Id x32 = e_ == kF32 ? Timeline::kNone : ew(n * kF32);
    const Id pow = ew(n * kF32);
    const Id mean = ew(tokens * kF32);
    drop(pow);
    const Id add = ew(tokens * kF32);
    drop(mean);
    const Id rs = ew(tokens * kF32);
    drop(add);
    Id normed = ew(n * kF32, 2);
    drop(rs);
    drop(x32);
    if (e_ != kF32) {
      const Id cast = ew(n * e_);
      drop(normed);
      normed = cast;
    }
    const Id out = ew(n * e_, 2);
    drop(normed);
    (void)x;
    return out;
  }
  Id attention_nograd(Id x) {
    const int64_t qd = s_.q_heads * s_.head_dim, kvd = s_.kv_heads * s_.head_dim;
    const Id n1 = norm_nograd(x, Tn());
    const Id in = gather_input(n1);
    const Id q = gemm(T(), qd, H());
    const Id k = gemm(T(), kvd, H());
    const Id v = gemm(T(), kvd, H());
    if (in != n1) drop(in);
    drop(n1);
    const Id qr = rope_forward(q, q_bytes());
    const Id kr = rope_forward(k, kv_bytes());
    Id lse = Timeline::kNone;
    const Id out = sdpa_forward(/*keep_lse=*/false, lse);
    drop(qr);
    drop(kr);
    drop(v);
    const Id o = reduce_output(gemm(T(), H(), qd));
    drop(out);
    const Id h = ew(Tn() * H() * e_, 2);
    drop(o);
    return h;
  }
  Id mlp_nograd(Id x, int64_t rows, int64_t width) {
    const Id gate = gemm(rows, width, H());
    const Id silu = ew(rows * width * e_);
    drop(gate);
    const Id up = gemm(rows, width, H());
    const Id mul = ew(rows * width * e_, 2);
    drop(silu);
    drop(up);
    const Id down = gemm(rows, H(), width);
    drop(mul);
    (void)x;
    return down;
  }
  Id dense_nograd(Id x) {
    const Id h = attention_nograd(x);
    const Id n2 = norm_nograd(h, Tn());
    const Id in = gather_input(n2);
    const Id down = mlp_nograd(in, T(), s_.ffn);
    if (in != n2) drop(in);
    drop(n2);
    const Id y = reduce_output(down);
    const Id out = ew(Tn() * H() * e_, 2);
    drop(y);
    drop(h);
    return out;
  }
  Id moe_nograd(Id x) {
    const int64_t N = T(), E = s_.experts, k = s_.top_k, R = N * k;
    const Id h = attention_nograd(x);
    const Id n2 = norm_nograd(h, Tn());
    const Id tokens = gather_input(n2);
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
    const Id cat_out = ew(R * H() * e_), cat_w = ew(R * e_);
    const Id y = ew(R * H() * e_, 2);
    drop(cat_out);
    drop(cat_w);
    const Id added = ew(N * H() * e_, 2);
    drop(combined);
    drop(y);
    combined = added;
    for (Id o : outputs) drop(o);
    for (Id t : {probs, chosen, weights, order, token_of, weight_of}) drop(t);
    if (s_.shared_ffn > 0) {
      const Id sh = mlp_nograd(tokens, N, s_.shared_ffn);
      const Id sum = ew(N * H() * e_, 2);
      drop(sh);
      drop(combined);
      combined = sum;
    }
    if (tokens != n2) drop(tokens);
    drop(n2);
    const Id y2 = reduce_output(combined);
    const Id out = ew(Tn() * H() * e_, 2);
    drop(y2);
    drop(h);
    return out;
  }

  // --- a layer under the recompute policy ---------------------------------------------------
  template <typename Layer>
  LayerSegments layer(Id (Replay::*fwd)(Id, Layer&), Id (Replay::*bwd)(Id, Layer&), Id (Replay::*nograd)(Id)) {
    const Id x = alloc(Tn() * H() * e_);  // the layer input, from the previous segment
    LayerSegments seg;
    if (s_.recompute == Recompute::Full) {
      // recompute(layer, {x}) (recompute.cpp): x saved, the layer runs without autograd, only
      // its output stays. In backward the layer runs again with autograd, then its backward.
      t_.begin();
      hold(x);
      const Id out = (this->*nograd)(x);
      drop(x);
      seg.forward = t_.end();
      const Id g = alloc(Tn() * H() * e_);
      t_.begin();
      Layer l;
      const Id out2 = (this->*fwd)(x, l);  // the recomputed output lives until backward returns
      const Id gin = (this->*bwd)(g, l);
      drop(out2);
      drop(x);  // the saved input
      seg.backward = t_.end();
      (void)out;
      (void)gin;
      return seg;
    }
    t_.begin();
    Layer l;
    const Id out = (this->*fwd)(x, l);
    drop(x);  // the caller's variable moves on to the output
    seg.forward = t_.end();
    (void)out;
    const Id g = alloc(Tn() * H() * e_);
    t_.begin();
    const Id gin = (this->*bwd)(g, l);
    (void)gin;
    seg.backward = t_.end();
    return seg;
  }

  // --- first stage: batch, rotary tables, embedding ----------------------------------------------
  struct Pre {
    Id inputs = Timeline::kNone, targets = Timeline::kNone, cos = Timeline::kNone, sin = Timeline::kNone;
    Id aux = Timeline::kNone;
  };
  LayerSegments pre(bool first_stage, bool last_stage) {
    LayerSegments seg;
    Pre p;
    t_.begin();
    const int64_t bs = s_.micro_batch * s_.seq;
    if (first_stage || last_stage) {
      // make_micro_batch: [b, s+1] int64, then contiguous inputs and targets.
      const Id all = alloc(s_.micro_batch * (s_.seq + 1) * kI64);
      p.inputs = alloc(bs * kI64);
      p.targets = alloc(bs * kI64);
      drop(all);
    }
    // Rotary tables (Rotary::cos_sin): positions, outer product, cat, cos and sin.
    const int64_t d = s_.head_dim;
    const Id positions = alloc(s_.seq * kI64);
    const Id posf = ew(s_.seq * kF32);
    const Id freqs = ew(s_.seq * d / 2 * kF32);
    drop(posf);
    const Id emb = ew(s_.seq * d * kF32);
    p.cos = ew(s_.seq * d * kF32);
    p.sin = ew(s_.seq * d * kF32);
    if (e_ != kF32) {
      const Id c = ew(s_.seq * d * e_), sn = ew(s_.seq * d * e_);
      drop(p.cos);
      drop(p.sin);
      p.cos = c;
      p.sin = sn;
    }
    drop(freqs);
    drop(emb);
    drop(positions);
    if (first_stage) {
      // Vocabulary-parallel embedding: each tp rank looks up its rows, then a sum (sp: a
      // reduce-scatter) across tp.
      Id x = ew(bs * H() * e_);
      if (s_.tp > 1) {
        if (sp()) {
          comm(CommKind::ReduceScatter, CommGroup::Tp, bs * H() * e_);
          const Id r = alloc(Tn() * H() * e_);
          drop(x);
          x = r;
        } else {
          comm(CommKind::AllReduce, CommGroup::Tp, bs * H() * e_);
        }
      }
      (void)x;  // the first layer's input
      p.aux = alloc(kF32);
    } else {
      alloc(Tn() * H() * e_);  // the activation received from the previous stage
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
    }
    seg.forward = t_.end();
    const Id g = alloc(Tn() * H() * e_);  // gradient of the first layer's input
    if (!first_stage) t_.begin();
    if (first_stage) {
      // embedding_dense_backward: a [V, H] gradient added into .grad. A tied weight is one leaf
      // used twice: autograd holds the LM head's gradient in the leaf's input buffer until this
      // one arrives, sums the two into a new tensor, then adds the sum into .grad.
      Id pending = Timeline::kNone;
      if (s_.tied_head) pending = alloc(s_.vocab * H() * e_);  // stands for the head's (see head())
      t_.begin();
      const Id gw = ew(s_.vocab * H() * e_, 1);
      if (s_.tp > 1) comm(sp() ? CommKind::AllGather : CommKind::AllReduce, CommGroup::Tp, bs * H() * e_);
      drop(g);
      if (pending != Timeline::kNone) {
        const Id sum = ew(s_.vocab * H() * e_, 2);  // out of place: the head's gradient is a view
        drop(gw);
        drop(pending);
        drop(sum);
      } else {
        drop(gw);
      }
      drop(p.aux);
    } else {
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
      drop(g);
    }
    drop(p.cos);
    drop(p.sin);
    drop(p.inputs);
    drop(p.targets);
    seg.backward = t_.end();
    return seg;
  }

  // --- last stage: final norm, LM head, cross-entropy (Transformer::forward) ------------------
  LayerSegments head(bool last_stage) {
    LayerSegments seg;
    const Id x = alloc(Tn() * H() * e_);  // the last layer's output
    if (!last_stage) {
      t_.begin();
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
      drop(x);  // sent to the next stage; nothing here saved it
      seg.forward = t_.end();
      t_.begin();
      alloc(Tn() * H() * e_);  // the gradient received from the next stage
      comm(CommKind::SendRecv, CommGroup::Pp, Tn() * H() * e_);
      seg.backward = t_.end();
      return seg;
    }
    const int64_t V = s_.vocab, bs = T();
    t_.begin();
    NormSaved norm;
    const Id hn = norm_forward(x, Tn(), norm);
    drop(x);  // hidden_states returns; fp32 keeps x saved by the norm
    const Id in = gather_input(hn);
    const Id logits = gemm(bs, V, H());  // saves its input
    if (in != hn) {
      drop(in);
    }
    Id l32 = Timeline::kNone;
    if (e_ != kF32) l32 = ew(bs * V * kF32);
    const Id lsm = ew(bs * V * kF32, 1);  // log_softmax, saved
    drop(alloc(2 * kF32));                 // nll_loss output and total weight
    drop(l32);
    drop(logits);  // Transformer::forward returns
    const Id loss = alloc(2 * kF32);  // loss_sum and the normalised loss
    seg.forward = t_.end();
    t_.begin();
    const Id glsm = ew(bs * V * kF32);    // nll_loss backward
    Id gl = ew(bs * V * kF32, 2);         // log_softmax backward
    drop(glsm);
    drop(lsm);
    if (e_ != kF32) {
      const Id cast = ew(bs * V * e_);
      drop(gl);
      gl = cast;
    }
    const Id ing = sp() ? alloc(bs * H() * e_) : Timeline::kNone;  // re-gathered input
    if (ing != Timeline::kNone) comm(CommKind::AllGather, CommGroup::Tp, bs * H() * e_);
    Id gh;
    if (s_.tied_head) {
      // The weight gradient waits in the tied leaf's input buffer for the embedding's (pre()).
      gemm(V, H(), bs);  // dW, kept
      gh = gemm(bs, H(), V);
      drop(gl);
      drop(hn);
    } else {
      gh = linear_backward(gl, bs, V, H(), hn);
    }
    drop(ing);
    gh = reduce_grad(gh);
    const Id gx = norm_backward(gh, norm, Timeline::kNone);
    drop(loss);
    (void)gx;
    seg.backward = t_.end();
    return seg;
  }

 private:
  Timeline& t_;
  const RankShape& s_;
  int64_t e_;
};

}  // namespace

MicroBatchModel model_micro_batch(const RankShape& shape) {
  if (shape.micro_batch < 1 || shape.seq < 1 || shape.hidden < 1 || shape.q_heads < 1 || shape.kv_heads < 1 ||
      shape.head_dim < 1 || shape.vocab < 1 || (shape.dtype_bytes != 2 && shape.dtype_bytes != 4))
    throw std::invalid_argument("model_micro_batch: invalid shape");
  MicroBatchModel m;
  auto run = [&](auto&& f) {
    Timeline t;
    Replay r(t, shape);
    return f(r);
  };
  m.pre_first = run([](Replay& r) { return r.pre(true, true); });
  m.pre_other = run([](Replay& r) { return r.pre(false, false); });
  m.dense = run([](Replay& r) {
    return r.layer<Replay::DenseLayer>(&Replay::dense_forward_inner, &Replay::dense_backward_inner,
                                       &Replay::dense_nograd);
  });
  if (shape.experts > 0)
    m.moe = run([](Replay& r) {
      return r.layer<Replay::MoeLayer>(&Replay::moe_forward_inner, &Replay::moe_backward_inner, &Replay::moe_nograd);
    });
  m.head_last = run([](Replay& r) { return r.head(true); });
  m.head_other = run([](Replay& r) { return r.head(false); });
  return m;
}

}  // namespace trainer::estimate
