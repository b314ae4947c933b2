#pragma once
// Internal to lib/estimate: the operations of our model replayed on a Timeline (see layer_model.h).
// Each forward function returns the tensors its backward needs (what autograd saved); backward
// functions consume the incoming gradient and return the outgoing one. Comments name the code in
// lib/model being replayed.
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "estimate/layer_model.h"
#include "estimate/tensor_timeline.h"

namespace trainer::estimate::replay {

using Id = Timeline::Id;
constexpr int64_t kF32 = 4;
constexpr int64_t kI64 = 8;

// Linear layers, RMSNorm, rotary, flash attention, tensor-parallel boundaries, the attention
// block and the SwiGLU MLP.
class ReplayOps {
 public:
  ReplayOps(Timeline& t, const RankShape& s) : t_(t), s_(s), e_(s.element_bytes()) {}

  // --- primitives -----------------------------------------------------------------------------
  // A memory-bound kernel writing `bytes` and reading `reads` times as much.
  Id ew(int64_t bytes, double reads = 1) {
    auto& c = t_.costs();
    c.memory_bytes += double(bytes) * (1 + reads);
    c.memory_kernels += 1;
    return t_.alloc(bytes);
  }
  // y[m,n] = x[m,k] w[n,k]^T in the model dtype (`grouped`: the experts' products, all local
  // experts' rows as one product at the grouped rate).
  Id gemm(int64_t m, int64_t n, int64_t k, bool grouped = false) {
    t_.costs().gemms.push_back(
        GemmShape{double(m), double(n), double(k), double((m * k + k * n + m * n) * e_), grouped});
    return t_.alloc(m * n * e_);
  }
  // The same product added in place into an existing tensor (addmm_): no new memory.
  void gemm_in_place(int64_t m, int64_t n, int64_t k) {
    t_.costs().gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n + 2 * m * n) * e_)});
  }
  // The product of model-dtype operands added by the GEMM into an fp32 tensor (cuBLAS with an
  // fp32 output and beta 1): reads and writes the fp32 output, no new memory.
  void gemm_into_f32(int64_t m, int64_t n, int64_t k) {
    t_.costs().gemms.push_back(GemmShape{double(m), double(n), double(k), double((m * k + k * n) * e_ + 2 * m * n * kF32)});
  }
  // Records a collective; returns its index for behind().
  size_t comm(CommKind kind, CommGroup group, int64_t bytes, bool overlapped = false) {
    t_.costs().comms.push_back(CommOp{kind, group, double(bytes), overlapped, {}});
    return t_.costs().comms.size() - 1;
  }
  // Where the next GEMM goes; with behind(), the GEMMs from there on ran while a collective flew.
  size_t gemm_mark() const { return t_.costs().gemms.size(); }
  void behind(size_t comm_index, size_t mark) {
    auto& c = t_.costs();
    c.comms[comm_index].behind.assign(c.gemms.begin() + std::ptrdiff_t(mark), c.gemms.end());
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

  // `count` in-place element-wise kernels over `bytes` (read and written).
  void in_place(int64_t bytes, int count) {
    t_.costs().memory_bytes += 2.0 * double(bytes) * count;
    t_.costs().memory_kernels += count;
  }

  bool sp() const { return s_.sequence_parallel && s_.tp > 1; }
  // The attention core runs without autograd and again in backward (core_attention, selective).
  bool core_recompute() const { return recipe::recomputes_core_attention(s_.recompute); }
  // The linears after a norm compute its output again in backward (selective).
  bool norm_recompute() const { return recipe::lean_layers(s_.recompute); }
  // Lean layers: the norm function, the SwiGLU product recomputed (selective).
  bool lean() const { return recipe::lean_layers(s_.recompute); }
  int64_t T() const { return s_.tokens(); }
  int64_t Tn() const { return s_.norm_tokens(); }
  int64_t H() const { return s_.hidden; }

  // --- linear layers: save the input, produce weight and input gradients ----------------------
  // Backward of y = x W^T (W [n,k], x [m,k]): the weight gradient is a new tensor accumulated
  // into the persistent .grad (AccumulateGrad adds in place, then frees it); the input gradient
  // is new. `saved` is the input the linear holds, released after.
  Id linear_backward(Id g, int64_t m, int64_t n, int64_t k, Id saved, bool drop_grad = true) {
    const Id gx = gemm(m, k, n);  // dx = g W
    weight_grad(n, k, m);         // dW = g^T x
    if (drop_grad) drop(g);
    drop(saved);
    return gx;
  }
  // A weight gradient dW [n, k] = g^T [n, m] x [m, k] added into the parameter's gradient: a new
  // tensor added in (AccumulateGrad / accumulate_gradient), or, with the fused gradient
  // accumulation of a bf16 model, the GEMM itself adding into the fp32 main_grad (no temporary).
  void weight_grad(int64_t n, int64_t k, int64_t m) {
    if (s_.fused.grad_accumulation && e_ != kF32) return gemm_into_f32(n, k, m);
    const Id gw = gemm(n, k, m);
    t_.costs().memory_bytes += 3.0 * double(n * k * e_);  // .grad += dW
    drop(gw);
  }

  // Backward of column_parallel_linear (parallel_linear.cpp): outputs of `widths` columns from
  // one input [rows, H] it saved once (`saved`; with `regather`, the sequence shard, all-gathered
  // again behind the input-gradient GEMMs). With `reduce` the summed input gradient is all-reduced
  // (reduce-scattered with sp) over tp behind the weight-gradient GEMMs. Consumes the output
  // gradients `gs`; returns the input gradient ([Tn, H] when reduce-scattered).
  Id column_backward(const std::vector<Id>& gs, const std::vector<int64_t>& widths, Id saved, int64_t rows,
                     bool regather, bool reduce) {
    const int64_t k = H();
    Id regathered = Timeline::kNone;
    size_t gather = 0;
    if (regather) {
      gather = comm(CommKind::AllGather, CommGroup::Tp, rows * k * e_);
      regathered = alloc(rows * k * e_);
    }
    const size_t dx_mark = gemm_mark();
    Id sum = Timeline::kNone;
    for (const int64_t n : widths) {
      const Id gx = gemm(rows, k, n);  // dx_i = g_i W_i, summed in place
      if (sum == Timeline::kNone)
        sum = gx;
      else
        accumulate(sum, gx);
    }
    if (regather) behind(gather, dx_mark);
    reduce = reduce && s_.tp > 1;
    const size_t reduction =
        reduce ? comm(sp() ? CommKind::ReduceScatter : CommKind::AllReduce, CommGroup::Tp, rows * k * e_) : 0;
    const size_t dw_mark = gemm_mark();
    for (const int64_t n : widths) weight_grad(n, k, rows);  // dW_i = g_i^T x
    if (reduce) behind(reduction, dw_mark);
    for (const Id g : gs) drop(g);
    drop(saved);
    drop(regathered);
    if (!reduce || !sp()) return sum;
    const Id r = alloc(Tn() * k * e_);
    drop(sum);
    return r;
  }

  // --- RMSNorm (rms_norm.cpp): x32 = x.float(); rstd = rsqrt(mean(x32^2) + eps);
  //     out = w * (x32 * rstd).to(dtype); lean: one autograd function saving x and rstd only, its
  //     backward dx = rstd (g w - xhat mean(g w xhat)); otherwise autograd's graph ------------
  struct NormSaved {
    Id x = Timeline::kNone, rs = Timeline::kNone;
    Id x32 = Timeline::kNone, normed = Timeline::kNone;  // autograd's graph (not lean)
    int64_t tokens = 0;
    bool lean = false;
    bool fused = false;  // ATen's fused RMSNorm (fused_ops.cpp): saves x and rstd like lean
  };
  // Lean layers (recompute policy selective) run the norm function; the others autograd's graph;
  // with the fused kernel, ATen's fused norm either way.
  Id norm_forward(Id x, int64_t tokens, NormSaved& saved) {
    saved.lean = lean();
    saved.fused = s_.fused.rms_norm;
    // The fused norm saves what the lean one does (norm_kernels runs its one kernel).
    return saved.lean || saved.fused ? norm_forward_lean(x, tokens, saved) : norm_forward_graph(x, tokens, saved);
  }
  // Returns the gradient of x (g is consumed). With `resid` (the residual stream's gradient
  // buffer) the result is accumulated into it in place, as autograd's input buffer does, and
  // `resid` is returned.
  Id norm_backward(Id g, const NormSaved& saved, Id resid) {
    if (saved.fused) return norm_backward_fused(g, saved, resid);
    return saved.lean ? norm_backward_lean(g, saved, resid) : norm_backward_graph(g, saved, resid);
  }
  // _fused_rms_norm_backward: dx in one pass over g and x, the weight's gradient in another.
  Id norm_backward_fused(Id g, const NormSaved& saved, Id resid) {
    const int64_t n = saved.tokens * H();
    const Id gx = ew(n * e_, 2);
    const Id gw = ew(H() * e_, 2.0 * double(saved.tokens));  // g and x read again, summed over rows
    drop(gw);
    return norm_backward_done(gx, g, saved, resid);
  }
  // The end of a norm function's backward: g and what it saved released, x's gradient `gx`
  // returned or (with `resid`) accumulated into the residual's gradient buffer.
  Id norm_backward_done(Id gx, Id g, const NormSaved& saved, Id resid) {
    drop(g);
    drop(saved.rs);
    drop(saved.x);
    if (resid == Timeline::kNone) return gx;
    accumulate(resid, gx);
    return resid;
  }
  // x^2, its mean, + eps, rsqrt over `tokens` rows: returns the fp32 rsqrt [tokens].
  Id rsqrt_rows(int64_t tokens) {
    const Id pow = ew(tokens * H() * kF32);
    const Id mean = ew(tokens * kF32);
    drop(pow);
    const Id add = ew(tokens * kF32);
    drop(mean);
    const Id rs = ew(tokens * kF32);
    drop(add);
    return rs;
  }
  // The norm function's forward kernels (rms_norm.cpp), nothing saved but the rsqrt (*rs): the
  // fp32 copy (bf16, a temporary), the rsqrt, the normalised values and their cast, the weight
  // mul. Returns the output.
  // `v` converted to `bytes` per element (the new tensor first, then `v` released) when the model
  // dtype is not fp32; `v` itself in fp32.
  Id cast_unless_f32(Id v, int64_t elements, int64_t bytes) {
    if (e_ == kF32) return v;
    const Id out = ew(elements * bytes);
    drop(v);
    return out;
  }
  Id norm_kernels(int64_t tokens, Id* rs) {
    const int64_t n = tokens * H();
    if (s_.fused.rms_norm) {  // one kernel: the output and the fp32 rstd per row
      *rs = alloc(tokens * kF32);
      return ew(n * e_, 1);
    }
    const Id x32 = e_ == kF32 ? Timeline::kNone : ew(n * kF32);
    *rs = rsqrt_rows(tokens);
    const Id normed = cast_unless_f32(ew(n * kF32, 2), n, e_);
    const Id out = ew(n * e_, 2);
    drop(normed);
    drop(x32);
    return out;
  }
  Id norm_forward_lean(Id x, int64_t tokens, NormSaved& saved) {
    saved.tokens = tokens;
    saved.x = x;
    hold(x);
    return norm_kernels(tokens, &saved.rs);  // the rsqrt saved
  }
  Id norm_backward_lean(Id g, const NormSaved& saved, Id resid) {
    const int64_t n = saved.tokens * H();
    // xhat = x.float() * rstd, computed again.
    const Id up = e_ == kF32 ? Timeline::kNone : ew(n * kF32);
    const Id xhat = ew(n * kF32, 2);
    drop(up);
    // The weight's gradient: g * xhat (in the model dtype), summed over rows.
    const Id cast = e_ == kF32 ? Timeline::kNone : ew(n * e_);
    const Id tmp = ew(n * e_, 2);
    const Id gw = ew(H() * e_);
    drop(tmp);
    drop(cast);
    drop(gw);
    // x's gradient: gn = (g * w).float(); c = mean(gn * xhat); gn -= xhat * c; gn *= rstd.
    const Id gn = cast_unless_f32(ew(n * e_, 2), n, kF32);
    const Id prod = ew(n * kF32, 2);
    const Id c = ew(saved.tokens * kF32);
    drop(prod);
    const Id xc = ew(n * kF32, 2);
    drop(xc);
    drop(c);
    in_place(n * kF32, 2);  // sub_ and mul_
    const Id gx = cast_unless_f32(gn, n, e_);
    drop(xhat);
    return norm_backward_done(gx, g, saved, resid);
  }

  // autograd's graph of the same arithmetic (not lean): the fp32 copy and normed are saved.
  Id norm_forward_graph(Id x, int64_t tokens, NormSaved& saved) {
    const int64_t n = tokens * H();
    saved.tokens = tokens;
    if (e_ == kF32) {
      saved.x32 = x;
      hold(x);  // saved by pow and by the mul
    } else {
      saved.x32 = ew(n * kF32);  // the fp32 copy, saved
    }
    saved.rs = rsqrt_rows(tokens);  // saved
    Id normed = ew(n * kF32, 2);
    if (e_ != kF32) {
      const Id cast = ew(n * e_);
      drop(normed);
      normed = cast;
    }
    saved.normed = normed;  // saved by the weight mul
    return ew(n * e_, 2);
  }
  Id norm_backward_graph(Id g, const NormSaved& saved, Id resid) {
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
    if (s_.fused.rope) {  // kernels/rope: one pass, the output contiguous
      const Id out = ew(bytes, 1);
      drop(x);
      return out;
    }
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
    if (s_.fused.rope) {
      const Id r = ew(bytes, 1);
      drop(g);
      return r;
    }
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
  // Ulysses repeats the key/value heads to lcm(kv, cp) when cp does not divide them
  // (ulysses_attention.cpp): what its all-to-all carries for k and v together.
  int64_t ulysses_kv_bytes() const { return 2 * kv_bytes() * (s_.cp / std::gcd(s_.kv_heads, s_.cp)); }
  // Ring attention runs one flash call per K/V block it holds in turn.
  int64_t attention_calls() const { return s_.cp > 1 && !s_.ulysses ? s_.cp : 1; }
  void cp_forward_comm() {
    if (s_.cp <= 1) return;
    if (s_.ulysses) {
      comm(CommKind::AllToAll, CommGroup::Cp, q_bytes() + ulysses_kv_bytes());
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
    t_.costs().attention_calls += attention_calls();
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
    t_.costs().attention_calls += attention_calls();
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
        comm(CommKind::AllToAll, CommGroup::Cp, q_bytes() + ulysses_kv_bytes());
      } else {
        const Id ring = alloc(2 * kv_bytes() + 2 * kv_bytes() / e_ * kF32);  // K/V in flight, dK/dV accumulators
        drop(ring);
        // K/V go round again (cp - 1 hops); each block's fp32 dK/dV travels with it and home (cp hops).
        comm(CommKind::SendRecv, CommGroup::Cp, (s_.cp - 1) * 2 * kv_bytes() + s_.cp * 2 * kv_bytes() / e_ * kF32,
             /*overlapped=*/true);
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
  // Backward of gather_input: the input gradient is summed (sp: reduce-scattered) across tp.
  Id reduce_grad(Id g) {
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
    Id o_in = Timeline::kNone;      // o_proj's input: a [s, b, h] view of the attention output
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
    // column_parallel_linear saves the (sharded) input once for q, k and v: the local reference
    // (none when it computes the norm's output again in backward).
    if (in != n1) drop(in);
    if (norm_recompute()) {
      drop(n1);
      a.norm_out = Timeline::kNone;
    }
    a.core.q = rope_forward(q, q_bytes());
    a.core.k = rope_forward(k, kv_bytes());
    a.core.v = v;
    Id lse = Timeline::kNone;
    // Recomputed (recomputed_linear: the core and o_proj as one function saving q, k, v): the core
    // runs without autograd and nobody keeps its output. Otherwise the flash node saves out and
    // o_proj saves it too: out back to [s, b, heads*d] is a view (SDPA's output follows the query's
    // memory layout, [s, b, heads, d] here, on the CPU and in the CUDA kernels).
    a.core.out = sdpa_forward(/*keep_lse=*/!core_recompute(), lse);
    a.core.lse = lse;
    if (!core_recompute()) {
      a.o_in = a.core.out;
      hold(a.o_in);
    }
    const Id o = reduce_output(gemm(T(), H(), qd));
    if (core_recompute()) {
      drop(a.core.out);
      a.core.out = Timeline::kNone;
    }
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
    if (core_recompute()) {
      // The core again with autograd (out and lse saved), its output o_proj's input, then o_proj's
      // gradients and the core's backward.
      Id lse = Timeline::kNone;
      a.core.out = sdpa_forward(/*keep_lse=*/true, lse);
      a.core.lse = lse;
      a.o_in = a.core.out;
      hold(a.o_in);
    }
    const Id gout = linear_backward(go, T(), H(), qd, a.o_in, /*drop_grad=*/go != g);
    Id dq, dk, dv;
    sdpa_backward(gout, a.core, dq, dk, dv);
    const Id gk = rope_backward(dk, kv_bytes());
    const Id gq = rope_backward(dq, q_bytes());
    if (norm_recompute()) a.norm_out = norm_nograd(Timeline::kNone, Tn());  // the norm's output again
    const Id gn = column_backward({gq, gk, dv}, {qd, kvd, kvd}, a.norm_out, T(), sp(), /*reduce=*/true);
    return norm_backward(gn, a.norm, g);
  }
  // With sp the row-parallel output's gradient is all-gathered into a new buffer; otherwise the
  // residual gradient itself feeds the projection.
  Id gather_grad_copy(Id g) {
    if (!sp()) return g;
    comm(CommKind::AllGather, CommGroup::Tp, T() * H() * e_);
    return alloc(T() * H() * e_);
  }

  // --- SwiGLU MLP (layers.cpp): down(silu(gate(x)) * up(x)). Lean (selective): the down
  //     projection is one function that saves gate and up and recomputes the product in backward
  //     (parallel_linear.cpp); otherwise autograd keeps silu(gate) and the product too -----------
  struct MlpSaved {
    Id in = Timeline::kNone, gate = Timeline::kNone, up = Timeline::kNone;
    Id silu = Timeline::kNone, mul = Timeline::kNone;  // autograd's graph (not lean)
    int64_t rows = 0, width = 0;
    bool regather = false, lean = false;
  };
  // x [rows, H] (already gathered when sp); `saved` is what gate and up keep for backward (the
  // sharded input with sp, regathered in backward); returns the (unreduced) output [rows, H].
  Id mlp_forward(Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m, bool lean_mlp) {
    m.lean = lean_mlp;
    return lean_mlp ? mlp_forward_lean(x, saved, rows, width, m) : mlp_forward_graph(x, saved, rows, width, m);
  }
  // g: gradient of the output [rows, H] (not consumed). Returns the gradient of the input, with
  // `reduce` reduced over tp by the gate/up column-parallel backward.
  Id mlp_backward(Id g, MlpSaved& m, bool reduce) {
    return m.lean ? mlp_backward_lean(g, m, reduce) : mlp_backward_graph(g, m, reduce);
  }
  Id mlp_forward_lean(Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m) {
    m.rows = rows;
    m.width = width;
    m.in = saved;
    m.regather = saved != x;
    hold(saved);  // gate and up save it once (column_parallel_linear)
    m.gate = gemm(rows, width, H());
    m.up = gemm(rows, width, H());
    const Id product = swiglu_product(rows * width * e_);
    const Id out = gemm(rows, H(), width);
    drop(product);
    return out;
  }
  // silu(gate) * up: a silu temporary and the product, or one pass of kernels/swiglu.
  Id swiglu_product(int64_t act) {
    if (s_.fused.swiglu) return ew(act, 2);
    const Id silu = ew(act);
    const Id product = ew(act, 2);
    drop(silu);
    return product;
  }
  // d gate and d up from the product's gradient: silu again, two muls and silu's backward, or one
  // pass of kernels/swiglu reading g, gate and up.
  std::pair<Id, Id> swiglu_grads(int64_t act) {
    if (s_.fused.swiglu) {
      const Id ggate = ew(act, 1.5);
      const Id gup = ew(act, 1.5);
      return {ggate, gup};
    }
    const Id silu = ew(act);
    const Id gup = ew(act, 2);
    drop(silu);
    const Id t = ew(act, 2);
    const Id ggate = ew(act, 2);
    drop(t);
    return {ggate, gup};
  }
  Id mlp_backward_lean(Id g, MlpSaved& m, bool reduce) {
    const int64_t rows = m.rows, width = m.width, act = rows * width * e_;
    // The down projection's weight gradient first, from the product computed again.
    const Id product = swiglu_product(act);
    weight_grad(H(), width, rows);
    drop(product);
    const Id gprod = gemm(rows, width, H());  // g W_down
    // d up = g * silu(gate) (silu again, a temporary), d gate = silu_backward(g * up, gate).
    const auto [ggate, gup] = swiglu_grads(act);
    drop(gprod);
    drop(m.gate);
    drop(m.up);
    return column_backward({ggate, gup}, {width, width}, m.in, rows, m.regather, reduce);
  }

  // autograd's graph (not lean): gate, silu(gate), up and the product saved.
  Id mlp_forward_graph(Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m) {
    m.rows = rows;
    m.width = width;
    m.in = saved;
    m.regather = saved != x;
    hold(saved);  // gate and up save it once (column_parallel_linear)
    m.gate = gemm(rows, width, H());
    if (!s_.fused.swiglu) m.silu = ew(rows * width * e_);  // the fused function saves gate and up only
    m.up = gemm(rows, width, H());
    m.mul = ew(rows * width * e_, 2);
    return gemm(rows, H(), width);
  }
  Id mlp_backward_graph(Id g, MlpSaved& m, bool reduce) {
    const int64_t rows = m.rows, width = m.width, act = rows * width * e_;
    const Id gmul = linear_backward(g, rows, H(), width, m.mul, /*drop_grad=*/false);
    if (s_.fused.swiglu) {
      const auto [ggate, gup] = swiglu_grads(act);
      drop(gmul);
      drop(m.up);
      drop(m.gate);
      return column_backward({ggate, gup}, {width, width}, m.in, rows, m.regather, reduce);
    }
    const Id gsilu = ew(act, 2);  // g * up
    const Id gup = ew(act, 2);    // g * silu
    drop(gmul);
    drop(m.silu);
    drop(m.up);
    const Id ggate = ew(act, 2);  // silu backward
    drop(gsilu);
    drop(m.gate);
    return column_backward({ggate, gup}, {width, width}, m.in, rows, m.regather, reduce);
  }

  // --- without autograd (the forward of recompute(full)): nothing is saved, every tensor is
  //     freed once its consumer has run ------------------------------------------------------
  Id norm_nograd(Id x, int64_t tokens) {
    (void)x;
    Id rs = Timeline::kNone;
    const Id out = norm_kernels(tokens, &rs);
    drop(rs);
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
    const Id up = gemm(rows, width, H());
    const Id mul = swiglu_product(rows * width * e_);
    const Id down = gemm(rows, H(), width);
    drop(mul);
    drop(gate);
    drop(up);
    (void)x;
    return down;
  }
 protected:
  Timeline& t_;
  const RankShape& s_;
  int64_t e_;
};

}  // namespace trainer::estimate::replay
