#include "model/rms_norm_replay.h"

#include <algorithm>
#include <numeric>

namespace trainer::model::replays {

namespace {

// The end of a norm function's backward: g and what it saved released, x's gradient `gx`
// returned or (with `resid`) accumulated into the residual's gradient buffer.
Id norm_backward_done(Replay& r, Id gx, Id g, const NormSaved& saved, Id resid) {
  r.drop(g);
  r.drop(saved.rs);
  r.drop(saved.x);
  if (resid == Timeline::kNone) return gx;
  r.accumulate(resid, gx);
  return resid;
}

// x^2, its mean, + eps, rsqrt over `tokens` rows: returns the fp32 rsqrt [tokens].
Id rsqrt_rows(Replay& r, int64_t tokens, int64_t width) {
  const Id pow = r.ew(tokens * width * kF32);
  const Id mean = r.ew(tokens * kF32);
  r.drop(pow);
  const Id add = r.ew(tokens * kF32);
  r.drop(mean);
  const Id rs = r.ew(tokens * kF32);
  r.drop(add);
  return rs;
}

// `v` converted to `bytes` per element (the new tensor first, then `v` released) when the model
// dtype is not fp32; `v` itself in fp32.
Id cast_unless_f32(Replay& r, Id v, int64_t elements, int64_t bytes) {
  if (r.e == kF32) return v;
  const Id out = r.ew(elements * bytes);
  r.drop(v);
  return out;
}

// The norm function's forward kernels (rms_norm.cpp), nothing saved but the rsqrt (*rs): the
// fp32 copy (bf16, a temporary), the rsqrt, the normalised values and their cast, the weight
// mul. Returns the output.
Id norm_kernels(Replay& r, int64_t tokens, int64_t width, bool fused, Id* rs) {
  const int64_t n = tokens * width;
  if (fused) {  // one kernel: the output and the fp32 rstd per row
    *rs = r.alloc(tokens * kF32);
    return r.ew(n * r.e, 1);
  }
  const Id x32 = r.e == kF32 ? Timeline::kNone : r.ew(n * kF32);
  *rs = rsqrt_rows(r, tokens, width);
  const Id normed = cast_unless_f32(r, r.ew(n * kF32, 2), n, r.e);
  const Id out = r.ew(n * r.e, 2);
  r.drop(normed);
  r.drop(x32);
  return out;
}

// _fused_rms_norm_backward: dx in one pass over g and x, the weight's gradient in another.
Id norm_backward_fused(Replay& r, Id g, const NormSaved& saved, Id resid) {
  const int64_t n = saved.tokens * saved.width;
  const Id gx = r.ew(n * r.e, 2);
  const Id gw = r.ew(saved.width * r.e, 2.0 * double(saved.tokens));  // g and x read again, summed over rows
  r.drop(gw);
  return norm_backward_done(r, gx, g, saved, resid);
}

Id norm_forward_lean(Replay& r, Id x, int64_t tokens, NormSaved& saved) {
  saved.tokens = tokens;
  saved.x = x;
  r.hold(x);
  return norm_kernels(r, tokens, saved.width, saved.fused, &saved.rs);  // the rsqrt saved
}

Id norm_backward_lean(Replay& r, Id g, const NormSaved& saved, Id resid) {
  const int64_t n = saved.tokens * saved.width;
  // xhat = x.float() * rstd, computed again.
  const Id up = r.e == kF32 ? Timeline::kNone : r.ew(n * kF32);
  const Id xhat = r.ew(n * kF32, 2);
  r.drop(up);
  // The weight's gradient: g * xhat (in the model dtype), summed over rows.
  const Id cast = r.e == kF32 ? Timeline::kNone : r.ew(n * r.e);
  const Id tmp = r.ew(n * r.e, 2);
  const Id gw = r.ew(saved.width * r.e);
  r.drop(tmp);
  r.drop(cast);
  r.drop(gw);
  // x's gradient: gn = (g * w).float(); c = mean(gn * xhat); gn -= xhat * c; gn *= rstd.
  const Id gn = cast_unless_f32(r, r.ew(n * r.e, 2), n, kF32);
  const Id prod = r.ew(n * kF32, 2);
  const Id c = r.ew(saved.tokens * kF32);
  r.drop(prod);
  const Id xc = r.ew(n * kF32, 2);
  r.drop(xc);
  r.drop(c);
  r.in_place(n * kF32, 2);  // sub_ and mul_
  const Id gx = cast_unless_f32(r, gn, n, r.e);
  r.drop(xhat);
  return norm_backward_done(r, gx, g, saved, resid);
}

// autograd's graph of the same arithmetic (not lean): the fp32 copy and normed are saved.
Id norm_forward_graph(Replay& r, Id x, int64_t tokens, NormSaved& saved) {
  const int64_t n = tokens * saved.width;
  saved.tokens = tokens;
  if (r.e == kF32) {
    saved.x32 = x;
    r.hold(x);  // saved by pow and by the mul
  } else {
    saved.x32 = r.ew(n * kF32);  // the fp32 copy, saved
  }
  saved.rs = rsqrt_rows(r, tokens, saved.width);  // saved
  Id normed = r.ew(n * kF32, 2);
  if (r.e != kF32) {
    const Id cast = r.ew(n * r.e);
    r.drop(normed);
    normed = cast;
  }
  saved.normed = normed;  // saved by the weight mul
  return r.ew(n * r.e, 2);
}

Id norm_backward_graph(Replay& r, Id g, const NormSaved& saved, Id resid) {
  const int64_t n = saved.tokens * saved.width;
  Id gn = r.ew(n * r.e, 2);         // g * w
  const Id tmp = r.ew(n * r.e, 2);  // g * normed, summed into the weight gradient
  const Id gw = r.ew(saved.width * r.e);
  r.drop(tmp);
  r.drop(saved.normed);
  r.drop(g);
  r.drop(gw);
  if (r.e != kF32) {
    const Id g32 = r.ew(n * kF32);
    r.drop(gn);
    gn = g32;
  }
  const Id gx1 = r.ew(n * kF32, 2);   // gn * rs
  const Id tmp2 = r.ew(n * kF32, 2);  // gn * x32, summed for rs
  const Id grs = r.ew(saved.tokens * kF32);
  r.drop(tmp2);
  r.drop(gn);
  const bool into_resid = resid != Timeline::kNone && r.e == kF32;
  Id acc = gx1;
  if (into_resid) {
    r.accumulate(resid, gx1);
    acc = resid;
  }
  const Id gpow = r.ew(n * kF32);  // through rsqrt, add, mean
  r.drop(grs);
  r.drop(saved.rs);
  // pow backward: grad * (2 * x.pow(1)), three temporaries alive together.
  const Id ta = r.ew(n * kF32);
  const Id tb = r.ew(n * kF32);
  const Id tc = r.ew(n * kF32, 2);
  r.drop(ta);
  r.drop(tb);
  r.drop(gpow);
  r.accumulate(acc, tc);
  r.drop(saved.x32);
  if (r.e == kF32) return acc;
  const Id cast = r.ew(n * r.e);  // x.float() backward
  r.drop(acc);
  if (resid == Timeline::kNone) return cast;
  r.accumulate(resid, cast);
  return resid;
}

}  // namespace

Id norm_forward(Replay& r, Id x, int64_t tokens, NormSaved& saved) {
  saved.width = r.H();
  saved.lean = r.lean();
  saved.fused = r.s.fused.rms_norm;
  // The fused norm saves what the lean one does (norm_kernels runs its one kernel).
  return saved.lean || saved.fused ? norm_forward_lean(r, x, tokens, saved) : norm_forward_graph(r, x, tokens, saved);
}

Id norm_backward(Replay& r, Id g, const NormSaved& saved, Id resid) {
  if (saved.fused) return norm_backward_fused(r, g, saved, resid);
  return saved.lean ? norm_backward_lean(r, g, saved, resid) : norm_backward_graph(r, g, saved, resid);
}

Id norm_nograd(Replay& r, Id x, int64_t tokens) {
  (void)x;
  Id rs = Timeline::kNone;
  const Id out = norm_kernels(r, tokens, r.H(), r.s.fused.rms_norm, &rs);
  r.drop(rs);
  return out;
}

Id head_norm_forward(Replay& r, Id x, int64_t rows, int64_t width, NormSaved& saved) {
  saved.width = width;
  saved.lean = true;
  saved.fused = false;
  return norm_forward_lean(r, x, rows, saved);
}

Id head_norm_nograd(Replay& r, Id x, int64_t rows, int64_t width) {
  (void)x;  // the caller's: nothing here keeps it
  Id rs = Timeline::kNone;
  const Id out = norm_kernels(r, rows, width, /*fused=*/false, &rs);
  r.drop(rs);
  return out;
}

}  // namespace trainer::model::replays
