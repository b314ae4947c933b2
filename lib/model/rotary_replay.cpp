#include "model/rotary_replay.h"

#include <algorithm>
#include <numeric>

namespace trainer::model::replays {

Id rope_forward(Replay& r, Id x, int64_t bytes) {
  if (r.s.fused.rope) {  // kernels/rope: one pass, the output contiguous
    const Id out = r.ew(bytes, 1);
    r.drop(x);
    return out;
  }
  const Id xc = r.ew(bytes, 2);
  const Id neg = r.ew(bytes / 2);
  const Id cat = r.ew(bytes);
  r.drop(neg);
  const Id rs = r.ew(bytes, 2);
  r.drop(cat);
  const Id out = r.ew(bytes, 2);
  r.drop(xc);
  r.drop(rs);
  r.drop(x);
  return out;
}

Id rope_backward(Replay& r, Id g, int64_t bytes) {
  if (r.s.fused.rope) {
    const Id res = r.ew(bytes, 1);
    r.drop(g);
    return res;
  }
  const Id a = r.ew(bytes, 2);      // g * sin
  const Id b = r.ew(bytes / 2);     // neg
  const Id c = r.ew(bytes);         // slice backward
  r.drop(a);
  const Id d = r.ew(bytes, 2);
  r.drop(b);
  r.drop(c);
  const Id res = r.ew(bytes, 2);      // all paths summed (g * cos + ...)
  r.drop(d);
  r.drop(g);
  return res;
}

RotaryTables rotary_tables(Replay& r) {
  RotaryTables tables;
  const int64_t d = r.s.rotary_dim();
  // Positions restarting at each document: a row per (position, sample).
  const int64_t rows = r.s.seq * (r.s.positions_per_sample ? r.s.micro_batch : 1);
  const Id positions = r.alloc(rows * kI64);
  const Id posf = r.ew(rows * kF32);
  const Id freqs = r.ew(rows * d / 2 * kF32);
  r.drop(posf);
  const Id emb = r.ew(rows * d * kF32);
  tables.cos = r.ew(rows * d * kF32);
  tables.sin = r.ew(rows * d * kF32);
  if (r.e != kF32) {
    const Id c = r.ew(rows * d * r.e), sn = r.ew(rows * d * r.e);
    r.drop(tables.cos);
    r.drop(tables.sin);
    tables.cos = c;
    tables.sin = sn;
  }
  r.drop(freqs);
  r.drop(emb);
  r.drop(positions);
  return tables;
}

}  // namespace trainer::model::replays
