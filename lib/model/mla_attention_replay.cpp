#include "model/mla_attention_replay.h"

namespace trainer::model::replays {

namespace {

// Widths on this rank: heads x the core's width (qk), the rotary part, the up-projections' outputs.
int64_t heads(Replay& r) { return r.s.q_heads; }
int64_t qk(Replay& r) { return r.s.head_dim; }
int64_t q_width(Replay& r) { return heads(r) * qk(r); }
int64_t kv_width(Replay& r) { return heads(r) * (r.s.mla.nope + r.s.mla.v); }
int64_t kv_a_width(Replay& r) { return r.s.mla.kv_lora + r.s.mla.rope; }
int64_t core_bytes(Replay& r) { return r.T() * q_width(r) * r.e; }

// The down-projections from the (gathered) norm output: q_a (or q_proj) and kv_a_proj_with_mqa.
void down_projections(Replay& r, Id& q_first, Id& kv_a) {
  q_first = r.s.mla.q_lora > 0 ? r.gemm(r.T(), r.s.mla.q_lora, r.H()) : r.gemm(r.T(), q_width(r), r.H());
  kv_a = r.gemm(r.T(), kv_a_width(r), r.H());
}

// From the query heads and the up-projected keys/values (both alive, the callers' locals) to the
// core's q, k and v: the rotary parts deinterleaved (a copy each) and rotated, the concatenations,
// the query scaled, the values padded.
void core_inputs(Replay& r, Id& query, Id& key, Id& value) {
  const int64_t q_rot = r.T() * heads(r) * r.s.mla.rope * r.e, k_rot = r.T() * r.s.mla.rope * r.e;
  const Id qr_in = r.s.mla.interleaved ? r.ew(q_rot) : r.alloc(0);
  const Id qr = rope_forward(r, qr_in, q_rot);
  const Id kr_in = r.ew(k_rot);  // deinterleaved, or the reshape of a narrow: a copy either way
  const Id kr = rope_forward(r, kr_in, k_rot);
  query = r.ew(core_bytes(r));  // cat(q_nope, q_rot)
  r.drop(qr);
  if (r.s.mla.scaled) {
    const Id scaled = r.ew(core_bytes(r));
    r.drop(query);
    query = scaled;
  }
  key = r.ew(core_bytes(r));  // cat(k_nope, k_rot expanded)
  r.drop(kr);
  value = r.ew(core_bytes(r));  // zero-padded to the core's width (or copied, as wide)
}

// The core's output `out` [b, heads, s, qk] as o_proj's input [s, b, heads * v]: a copy of the first
// v columns of each head, or, as wide, a view (the output follows the query's [s, b, heads, qk]
// layout), which holds `out`.
Id o_proj_input(Replay& r, Id out) {
  if (r.s.mla.v < qk(r)) return r.ew(r.T() * heads(r) * r.s.mla.v * r.e);
  r.hold(out);
  return out;
}

}  // namespace

Id mla_attention_forward(Replay& r, Id x, MlaBlock& a) {
  const Id n1 = norm_forward(r, x, r.Tn(), a.norm);
  a.norm_out = n1;
  const Id in = gather_input(r, n1, /*gemms=*/2);
  Id q_first, kv_a;
  down_projections(r, q_first, kv_a);
  if (in != n1) r.drop(in);
  if (r.norm_recompute()) {
    r.drop(n1);
    a.norm_out = Timeline::kNone;
  }
  // The latent norms save their inputs (q_a's output; kv_a's output, of which the latent is a view).
  Id q = q_first;
  if (r.s.mla.q_lora > 0) {
    a.q_latent = head_norm_forward(r, q_first, r.T(), r.s.mla.q_lora, a.q_norm);
    q = r.gemm(r.T(), q_width(r), r.s.mla.q_lora);  // q_b_proj, saving the normalised latent
  }
  a.kv_latent = head_norm_forward(r, kv_a, r.T(), r.s.mla.kv_lora, a.kv_norm);
  const Id kv = r.gemm(r.T(), kv_width(r), r.s.mla.kv_lora);
  Id query, key, value;
  core_inputs(r, query, key, value);
  a.core.q = query;
  a.core.k = key;
  a.core.v = value;
  Id lse = Timeline::kNone, mask = Timeline::kNone;
  a.core.out = attention_core_forward(r, /*keep_lse=*/!r.core_recompute(), lse, mask);
  a.core.lse = lse;
  a.core.mask = mask;
  const Id o_in = o_proj_input(r, a.core.out);
  if (!r.core_recompute()) a.o_in = o_in;
  const Id o = row_output(r, r.T(), r.H(), heads(r) * r.s.mla.v);
  if (r.core_recompute()) {
    r.drop(o_in);
    r.drop(a.core.out);
    a.core.out = Timeline::kNone;
  }
  // MlaAttention::forward's locals: the projections' outputs.
  r.drop(q_first);
  if (q != q_first) r.drop(q);
  r.drop(kv_a);
  r.drop(kv);
  a.h = r.ew(r.Tn() * r.H() * r.e, 2);  // h = x + o
  r.drop(o);
  return a.h;
}

Id mla_attention_backward(Replay& r, Id g, MlaBlock& a) {
  const int64_t v_in = heads(r) * r.s.mla.v;
  const Id go = gather_grad_copy(r, g);
  if (r.core_recompute()) {
    attention_core_again(r, a.core);
    a.o_in = o_proj_input(r, a.core.out);
  }
  // Recomputed (recomputed_linear's backward), o_proj's input and its gradient are the function's
  // locals until the core's backward has run.
  Id held_in = Timeline::kNone;
  if (r.core_recompute()) {
    held_in = a.o_in;
    r.hold(held_in);
  }
  const Id gout = linear_backward(r, go, r.T(), r.H(), v_in, a.o_in, /*drop_grad=*/go != g);
  Id gcore = gout;  // as wide: the reshape's backward is a view
  Id held_grad = Timeline::kNone;
  if (r.s.mla.v < qk(r)) {
    gcore = r.ew(core_bytes(r));  // the narrow's backward: zeros past v_head_dim
    if (r.core_recompute())
      held_grad = gout;
    else
      r.drop(gout);
  }
  Id dq, dk, dv;
  attention_core_backward(r, gcore, a.core, dq, dk, dv);
  r.drop(held_in);
  r.drop(held_grad);
  // Keys and values: the up-projection's gradient gathered from k_nope and v (two narrow
  // backwards, summed), the rotary key part summed over the heads and rotated back.
  const int64_t kv_bytes = r.T() * kv_width(r) * r.e, k_rot = r.T() * r.s.mla.rope * r.e;
  const Id gkv = r.ew(kv_bytes);
  r.accumulate(gkv, r.ew(kv_bytes));
  r.drop(dv);
  const Id gk_rot = rope_backward(r, r.ew(k_rot), k_rot);
  r.drop(dk);
  const Id gk_rot_laid = r.ew(k_rot);  // back to DeepSeek's layout (or the reshape's copy)
  r.drop(gk_rot);
  // Queries: the scale, then the rotary part rotated back and both parts scattered into the
  // up-projection's gradient.
  Id gq_all = dq;
  if (r.s.mla.scaled) {
    gq_all = r.ew(core_bytes(r));
    r.drop(dq);
  }
  const int64_t q_rot = r.T() * heads(r) * r.s.mla.rope * r.e;
  const Id gq_rot = rope_backward(r, r.ew(q_rot), q_rot);
  const Id gq_rot_laid = r.s.mla.interleaved ? r.ew(q_rot) : gq_rot;
  if (gq_rot_laid != gq_rot) r.drop(gq_rot);
  const Id gq = r.ew(core_bytes(r));
  r.accumulate(gq, r.ew(core_bytes(r)));
  r.drop(gq_rot_laid);
  r.drop(gq_all);
  // kv_b_proj, the kv latent norm, and kv_a's output gradient from the latent and the rotary key.
  const Id glatent = linear_backward(r, gkv, r.T(), kv_width(r), r.s.mla.kv_lora, a.kv_latent);
  const Id gn_latent = norm_backward(r, glatent, a.kv_norm, Timeline::kNone);
  const Id gkv_a = r.ew(r.T() * kv_a_width(r) * r.e);
  r.accumulate(gkv_a, gn_latent);
  r.accumulate(gkv_a, gk_rot_laid);
  Id gq_first = gq;
  int64_t q_first_width = q_width(r);
  if (r.s.mla.q_lora > 0) {
    const Id gq_latent = linear_backward(r, gq, r.T(), q_width(r), r.s.mla.q_lora, a.q_latent);
    gq_first = norm_backward(r, gq_latent, a.q_norm, Timeline::kNone);
    q_first_width = r.s.mla.q_lora;
  }
  if (r.norm_recompute()) a.norm_out = norm_nograd(r, Timeline::kNone, r.Tn());
  const Id gn = column_backward(r, {gq_first, gkv_a}, {q_first_width, kv_a_width(r)}, a.norm_out, r.T(), r.sp(),
                                /*reduce=*/true);
  return norm_backward(r, gn, a.norm, g);
}

Id mla_attention_nograd(Replay& r, Id x) {
  const Id n1 = norm_nograd(r, x, r.Tn());
  const Id in = gather_input(r, n1, /*gemms=*/2);
  Id q_first, kv_a;
  down_projections(r, q_first, kv_a);
  if (in != n1) r.drop(in);
  r.drop(n1);
  Id q = q_first;
  if (r.s.mla.q_lora > 0) {
    const Id latent = head_norm_nograd(r, q_first, r.T(), r.s.mla.q_lora);
    q = r.gemm(r.T(), q_width(r), r.s.mla.q_lora);
    r.drop(latent);
  }
  const Id latent = head_norm_nograd(r, kv_a, r.T(), r.s.mla.kv_lora);
  const Id kv = r.gemm(r.T(), kv_width(r), r.s.mla.kv_lora);
  r.drop(latent);
  Id query, key, value;
  core_inputs(r, query, key, value);
  Id lse = Timeline::kNone, mask = Timeline::kNone;
  const Id out = attention_core_forward(r, /*keep_lse=*/false, lse, mask);
  r.drop(query);
  r.drop(key);
  r.drop(value);
  const Id o_in = o_proj_input(r, out);
  r.drop(out);
  const Id o = row_output(r, r.T(), r.H(), heads(r) * r.s.mla.v);
  r.drop(o_in);
  r.drop(q_first);
  if (q != q_first) r.drop(q);
  r.drop(kv_a);
  r.drop(kv);
  const Id h = r.ew(r.Tn() * r.H() * r.e, 2);
  r.drop(o);
  return h;
}

}  // namespace trainer::model::replays
