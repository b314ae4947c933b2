#include "model/attention_replay.h"

#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <utility>
#include <vector>

namespace trainer::model::replays {

namespace {

// --- attention core: scaled_dot_product_attention (flash: saves q, k, v, out and the fp32
//     log-sum-exp; no s x s matrix) --------------------------------------------------------
int64_t q_bytes(Replay& r) { return r.T() * r.s.q_heads * r.s.head_dim * r.e; }

int64_t kv_bytes(Replay& r) { return r.T() * r.s.kv_heads * r.s.head_dim * r.e; }

int64_t lse_bytes(Replay& r) { return r.s.micro_batch * r.s.q_heads * r.s.seq * kF32; }

// CPU flash attention (aten/native/cpu/FlashAttentionKernel.cpp) keeps per-thread blocks:
// q split 32/64/256 by length, kv split 512.
int64_t q_split(Replay& r) { return std::min<int64_t>(r.s.seq >= 768 ? 256 : r.s.seq >= 192 ? 64 : 32, r.s.seq); }

int64_t kv_split(Replay& r) { return std::min<int64_t>(512, r.s.seq); }

double attention_flops_forward(Replay& r) {
  // QK^T and AV: 4 b heads s^2 d, half of it under the causal mask. With cp, each rank's two
  // chunks see on average half of the whole sequence: the same total split cp ways.
  if (r.s.window == 0) {
    const double full = 4.0 * double(r.s.micro_batch) * double(r.s.q_heads) * double(r.s.seq) *
                        double(r.s.seq * r.s.cp) * double(r.s.head_dim);
    return full / 2.0;
  }
  // A sliding window W: query i attends min(i + 1, W) keys.
  const double S = double(r.s.seq * r.s.cp), W = double(r.s.window);
  const double pairs = W * (W + 1) / 2 + (S - W) * W;
  return 4.0 * double(r.s.micro_batch) * double(r.s.q_heads) * pairs * double(r.s.head_dim) / double(r.s.cp);
}

// The flash kernel takes a GPU's window in bf16; on the CPU or in fp32 (and for Ulysses, over the
// gathered whole sequence) attention runs with an additive [S, S] mask (causal_sdpa.cpp). Ring attention builds
// one per block pair instead (ring_attention.cpp).
bool window_mask(Replay& r) {
  return r.s.window > 0 && (r.s.device == Device::Cpu || r.e == kF32) && (r.s.cp == 1 || r.s.ulysses);
}

// Document masking where each document runs alone (causal_sdpa.cpp): at cp 1 and in Ulysses.
bool per_document(Replay& r) { return r.s.documents && (r.s.cp == 1 || r.s.ulysses); }

// band_mask (attention_block.cpp): two boolean comparisons, then the mask in the model dtype.
Id build_mask(Replay& r, int64_t rows, int64_t keys) {
  const Id comparisons = r.alloc(2 * rows * keys);
  const Id mask = r.alloc(rows * keys * r.e);
  r.drop(comparisons);
  return mask;
}

// Ring attention under a window: the (query chunk, key chunk) pairs rank 0 attends over the ring
// (ring_attention.cpp band_pairs; the other ranks' counts differ by at most a few).
int64_t ring_band_calls(Replay& r) {
  const int64_t n = r.s.cp, c = r.s.seq / 2, w = r.s.window;
  int64_t calls = 0;
  for (int64_t step = 0; step < n; ++step) {
    const int64_t source = (n - step) % n;
    for (const int64_t query : {int64_t(0), 2 * n - 1})
      for (const int64_t key : {source, 2 * n - 1 - source}) {
        const int64_t offset = (query - key) * c;
        if (offset >= 0 && c - 1 - offset + w > 0) ++calls;
      }
  }
  return calls;
}

// Ulysses repeats the key/value heads to lcm(kv, cp) when cp does not divide them
// (ulysses_attention.cpp): what its all-to-all carries for k and v together.
int64_t ulysses_kv_bytes(Replay& r) { return 2 * kv_bytes(r) * (r.s.cp / std::gcd(r.s.kv_heads, r.s.cp)); }

// Ring attention runs one flash call per K/V block it holds in turn (under a window, one per
// block pair inside it).
int64_t attention_calls(Replay& r) {
  if (r.s.cp > 1 && !r.s.ulysses) return r.s.window > 0 ? ring_band_calls(r) : r.s.cp;
  return 1;
}

// Ring attention's mask of one block pair under a window on the CPU, built and freed per call.
void ring_band_mask(Replay& r) {
  if (r.s.window == 0 || r.s.device != Device::Cpu || r.s.cp == 1 || r.s.ulysses) return;
  const int64_t c = r.s.seq / 2;
  r.drop(build_mask(r, c, c));
}

// Ring attention with documents runs each block's pairs of runs of one document (ring_attention.cpp):
// through the flash kernel, but under a sliding window the pairs it cuts run as written-out
// operations on their scores (attend_masked, attention_block.cpp). Counted as at most a whole
// block's: `matrices` fp32 [b, heads, s, s] at a time, freed per block (an upper bound).
void ring_document_scores(Replay& r, int64_t matrices) {
  if (!r.s.documents || r.s.cp == 1 || r.s.ulysses || r.s.window == 0) return;
  r.drop(r.alloc(matrices * r.s.micro_batch * r.s.q_heads * r.s.seq * r.s.seq * kF32));
}

void cp_forward_comm(Replay& r) {
  if (r.s.cp <= 1) return;
  if (r.s.ulysses) {
    r.comm(CommKind::AllToAll, CommGroup::Cp, q_bytes(r) + ulysses_kv_bytes(r));
    r.comm(CommKind::AllToAll, CommGroup::Cp, q_bytes(r));
  } else {
    // Ring: every rank passes its K and V block around the cp ranks while computing.
    r.comm(CommKind::SendRecv, CommGroup::Cp, (r.s.cp - 1) * 2 * kv_bytes(r), /*overlapped=*/true);
  }
}

}  // namespace

Id attention_core_forward(Replay& r, bool keep_lse, Id& lse, Id& mask) {
  const int64_t whole = r.s.seq * r.s.cp;  // Ulysses attends over the whole sequence
  // Each document alone: their outputs, which their calls save, besides the concatenation the
  // core returns (a window applies inside each document, no whole-sequence mask).
  if (per_document(r))
    mask = r.alloc(q_bytes(r));
  else
    mask = window_mask(r) ? build_mask(r, whole, whole) : Timeline::kNone;
  ring_band_mask(r);
  ring_document_scores(r, 2);  // the scores, then the probabilities
  const Id out = r.alloc(q_bytes(r));
  lse = r.alloc(lse_bytes(r));
  r.t.costs().attention_flops += attention_flops_forward(r);
  r.t.costs().attention_calls += attention_calls(r);
  if (r.s.cp > 1 && !r.s.ulysses) {
    // Ring attention: the K/V blocks in flight (receive buffers, double-buffered).
    const Id ring = r.alloc(2 * kv_bytes(r));
    r.drop(ring);
  }
  if (r.s.device == Device::Cpu) {
    const int64_t qs = q_split(r), kvs = kv_split(r);
    int64_t ws = r.s.cpu_threads * (qs * kvs + 2 * qs + qs * r.s.head_dim) * kF32;
    if (r.e != kF32) ws += r.s.cpu_threads * qs * kvs * r.e;
    r.drop(r.alloc(ws));
  }
  cp_forward_comm(r);
  if (!keep_lse) {
    r.drop(lse);
    lse = Timeline::kNone;
    r.drop(mask);
    mask = Timeline::kNone;
  }
  return out;
}

void attention_core_again(Replay& r, AttentionSaved& a) {
  Id lse = Timeline::kNone, mask = Timeline::kNone;
  a.out = attention_core_forward(r, /*keep_lse=*/true, lse, mask);
  a.lse = lse;
  a.mask = mask;
}

void attention_core_backward(Replay& r, Id g, const AttentionSaved& a, Id& dq, Id& dk, Id& dv) {
  dq = r.alloc(q_bytes(r));
  dk = r.alloc(kv_bytes(r));
  dv = r.alloc(kv_bytes(r));
  r.t.costs().attention_flops += 2.5 * attention_flops_forward(r);  // flash backward ~ 2.5x forward
  r.t.costs().attention_calls += attention_calls(r);
  ring_band_mask(r);
  ring_document_scores(r, 3);  // the probabilities, their gradient and the scores' gradient
  // Each document's gradients, before the split's backward concatenates them into dq, dk, dv.
  if (per_document(r)) r.drop(r.alloc(q_bytes(r) + 2 * kv_bytes(r)));
  if (r.s.device == Device::Cpu) {
    const int64_t qs = q_split(r), kvs = kv_split(r);
    int64_t ws = r.s.cpu_threads * 2 * qs * kvs * kF32;
    if (r.e != kF32) ws += r.s.cpu_threads * (2 * qs * kvs * r.e + qs * r.s.head_dim * kF32);
    r.drop(r.alloc(ws));
  } else {
    // FlashAttention-2 backward: fp32 dq accumulator and softmax row sums; with grouped-query
    // attention dk, dv per query head before the group sum.
    const Id acc = r.alloc(r.T() * r.s.q_heads * r.s.head_dim * kF32 + lse_bytes(r));
    Id expand = Timeline::kNone;
    if (r.s.q_heads != r.s.kv_heads) expand = r.alloc(2 * q_bytes(r));
    r.drop(acc);
    r.drop(expand);
  }
  if (r.s.cp > 1) {
    if (r.s.ulysses) {
      r.comm(CommKind::AllToAll, CommGroup::Cp, q_bytes(r));
      r.comm(CommKind::AllToAll, CommGroup::Cp, q_bytes(r) + ulysses_kv_bytes(r));
    } else {
      const Id ring = r.alloc(2 * kv_bytes(r) + 2 * kv_bytes(r) / r.e * kF32);  // K/V in flight, dK/dV accumulators
      r.drop(ring);
      // K/V go round again (cp - 1 hops); each block's fp32 dK/dV travels with it and home (cp hops).
      r.comm(CommKind::SendRecv, CommGroup::Cp, (r.s.cp - 1) * 2 * kv_bytes(r) + r.s.cp * 2 * kv_bytes(r) / r.e * kF32,
           /*overlapped=*/true);
    }
  }
  r.drop(g);
  r.drop(a.k);
  r.drop(a.q);
  r.drop(a.v);
  r.drop(a.lse);
  r.drop(a.out);
  r.drop(a.mask);
}

namespace {

// model.attention_bias: q, k and v each add their bias into a new tensor (the add saves nothing);
// the projection's output is freed.
void add_biases(Replay& r, std::initializer_list<std::pair<Id*, int64_t>> outputs) {
  if (!r.s.attention_bias) return;
  for (const auto& [id, width] : outputs) {
    const Id biased = r.ew(r.T() * width * r.e);
    r.drop(*id);
    *id = biased;
  }
}

// The biases' gradients: each a sum over the rows of its output's gradient, added into the
// parameter's gradient.
void bias_grads(Replay& r, std::initializer_list<int64_t> widths) {
  if (!r.s.attention_bias) return;
  for (const int64_t width : widths) {
    r.drop(r.ew(width * r.e, double(r.T())));
    r.t.costs().memory_bytes += 3.0 * double(width * r.e);  // .grad += db
  }
}

}  // namespace

Id attention_forward(Replay& r, Id x, AttentionBlock& a) {
  const Id n1 = norm_forward(r, x, r.Tn(), a.norm);
  a.norm_out = n1;
  const Id in = gather_input(r, n1, /*gemms=*/3);
  const int64_t qd = r.s.q_heads * r.s.head_dim, kvd = r.s.kv_heads * r.s.head_dim;
  Id q = r.gemm(r.T(), qd, r.H());
  Id k = r.gemm(r.T(), kvd, r.H());
  Id v = r.gemm(r.T(), kvd, r.H());
  // column_parallel_linear saves the (sharded) input once for q, k and v: the local reference
  // (none when it computes the norm's output again in backward).
  if (in != n1) r.drop(in);
  add_biases(r, {{&q, qd}, {&k, kvd}, {&v, kvd}});
  if (r.norm_recompute()) {
    r.drop(n1);
    a.norm_out = Timeline::kNone;
  }
  // The norm functions save q and k (the projections' outputs); the normalised q and k stay alive
  // in Attention::forward's locals until it returns.
  std::vector<Id> until_return;
  if (r.s.qk_norm) {
    const Id qn = head_norm_forward(r, q, r.T() * r.s.q_heads, r.s.head_dim, a.q_norm);
    r.drop(q);
    q = qn;
    const Id kn = head_norm_forward(r, k, r.T() * r.s.kv_heads, r.s.head_dim, a.k_norm);
    r.drop(k);
    k = kn;
    until_return = {qn, kn};
    for (const Id t : until_return) r.hold(t);
  }
  a.core.q = rope_forward(r, q, q_bytes(r));
  a.core.k = rope_forward(r, k, kv_bytes(r));
  a.core.v = v;
  Id lse = Timeline::kNone, mask = Timeline::kNone;
  // Recomputed (recomputed_linear: the core and o_proj as one function saving q, k, v): the core
  // runs without autograd and nobody keeps its output. Otherwise the flash node saves out and
  // o_proj saves it too: out back to [s, b, heads*d] is a view (SDPA's output follows the query's
  // memory layout, [s, b, heads, d] here, on the CPU and in the CUDA kernels).
  a.core.out = attention_core_forward(r, /*keep_lse=*/!r.core_recompute(), lse, mask);
  a.core.lse = lse;
  a.core.mask = mask;
  if (!r.core_recompute()) {
    a.o_in = a.core.out;
    r.hold(a.o_in);
  }
  const Id o = row_output(r, r.T(), r.H(), qd);
  if (r.core_recompute()) {
    r.drop(a.core.out);
    a.core.out = Timeline::kNone;
  }
  for (const Id t : until_return) r.drop(t);
  a.h = r.ew(r.Tn() * r.H() * r.e, 2);  // h = x + o
  r.drop(o);
  return a.h;
}

Id attention_backward(Replay& r, Id g, AttentionBlock& a) {
  const int64_t qd = r.s.q_heads * r.s.head_dim, kvd = r.s.kv_heads * r.s.head_dim;
  // o_proj: its input gradient is the gradient of the attention output.
  const Id go = gather_grad_copy(r, g);
  if (r.core_recompute()) {
    // The core again with autograd (out and lse saved), its output o_proj's input, then o_proj's
    // gradients and the core's backward.
    attention_core_again(r, a.core);
    a.o_in = a.core.out;
    r.hold(a.o_in);
  }
  const Id gout = linear_backward(r, go, r.T(), r.H(), qd, a.o_in, /*drop_grad=*/go != g);
  Id dq, dk, dv;
  attention_core_backward(r, gout, a.core, dq, dk, dv);
  Id gk = rope_backward(r, dk, kv_bytes(r));
  Id gq = rope_backward(r, dq, q_bytes(r));
  if (r.s.qk_norm) {
    gk = norm_backward(r, gk, a.k_norm, Timeline::kNone);
    gq = norm_backward(r, gq, a.q_norm, Timeline::kNone);
  }
  if (r.norm_recompute()) a.norm_out = norm_nograd(r, Timeline::kNone, r.Tn());  // the norm's output again
  bias_grads(r, {qd, kvd, kvd});
  const Id gn = column_backward(r, {gq, gk, dv}, {qd, kvd, kvd}, a.norm_out, r.T(), r.sp(), /*reduce=*/true);
  return norm_backward(r, gn, a.norm, g);
}

Id attention_nograd(Replay& r, Id x) {
  const int64_t qd = r.s.q_heads * r.s.head_dim, kvd = r.s.kv_heads * r.s.head_dim;
  const Id n1 = norm_nograd(r, x, r.Tn());
  const Id in = gather_input(r, n1, /*gemms=*/3);
  Id q = r.gemm(r.T(), qd, r.H());
  Id k = r.gemm(r.T(), kvd, r.H());
  Id v = r.gemm(r.T(), kvd, r.H());
  if (in != n1) r.drop(in);
  add_biases(r, {{&q, qd}, {&k, kvd}, {&v, kvd}});
  r.drop(n1);
  // As in forward: the projections' outputs and the normalised q and k live until Attention::forward
  // returns.
  std::vector<Id> until_return;
  if (r.s.qk_norm) {
    const Id qn = head_norm_nograd(r, q, r.T() * r.s.q_heads, r.s.head_dim);
    const Id kn = head_norm_nograd(r, k, r.T() * r.s.kv_heads, r.s.head_dim);
    until_return = {q, k, qn, kn};
    r.hold(qn);
    r.hold(kn);
    q = qn;
    k = kn;
  }
  const Id qr = rope_forward(r, q, q_bytes(r));
  const Id kr = rope_forward(r, k, kv_bytes(r));
  Id lse = Timeline::kNone, mask = Timeline::kNone;
  const Id out = attention_core_forward(r, /*keep_lse=*/false, lse, mask);
  r.drop(qr);
  r.drop(kr);
  r.drop(v);
  const Id o = row_output(r, r.T(), r.H(), qd);
  r.drop(out);
  for (const Id t : until_return) r.drop(t);
  const Id h = r.ew(r.Tn() * r.H() * r.e, 2);
  r.drop(o);
  return h;
}

}  // namespace trainer::model::replays
