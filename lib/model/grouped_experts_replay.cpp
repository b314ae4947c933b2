#include "model/grouped_experts_replay.h"

#include <algorithm>
#include <numeric>

namespace trainer::model::replays {

namespace {

// Rows of the local experts, split as evenly as counts allow.
std::vector<int64_t> expert_split(Replay& r) {
  std::vector<int64_t> rows(size_t(std::max<int64_t>(1, r.s.local_experts)), 0);
  const int64_t total = r.s.expert_rows, n = int64_t(rows.size());
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = total / n + (i < total % n ? 1 : 0);
  return rows;
}

}  // namespace

Id grouped_forward(Replay& r, Id x, int64_t n, GroupedSaved& g) {
  const int64_t width = r.s.expert_ffn;
  g.n = n;
  g.rows = x;
  r.hold(x);
  g.h1 = r.gemm(n, width, r.H(), true);
  g.h3 = r.gemm(n, width, r.H(), true);
  const Id silu = r.ew(n * width * r.e);
  const Id a = r.ew(n * width * r.e, 2);
  r.drop(silu);
  const Id y = r.gemm(n, r.H(), width, true);
  r.drop(a);
  return y;
}

Id grouped_nograd(Replay& r, int64_t n) {
  const int64_t width = r.s.expert_ffn;
  const Id h1 = r.gemm(n, width, r.H(), true), h3 = r.gemm(n, width, r.H(), true);
  const Id silu = r.ew(n * width * r.e);
  const Id a = r.ew(n * width * r.e, 2);
  r.drop(silu);
  r.drop(h1);
  r.drop(h3);
  const Id y = r.gemm(n, r.H(), width, true);
  r.drop(a);
  return y;
}

Id grouped_backward(Replay& r, Id go, GroupedSaved& g) {
  const int64_t n = g.n, width = r.s.expert_ffn, act = n * width * r.e;
  const Id da = r.gemm(n, width, r.H(), true);  // go W2
  const Id sig = r.ew(act);
  const Id silu = r.ew(act, 2);
  const Id dh3 = r.ew(act, 2);
  // dh1 = da * h3 * s (1 + h1 (1 - s)): one temporary, updated in place.
  const Id dsilu = r.ew(act);
  r.in_place(act, 3);
  r.drop(sig);
  const Id dh1 = r.ew(act, 2);
  r.in_place(act, 1);
  r.drop(dsilu);
  r.drop(da);
  const Id gx = r.gemm(n, r.H(), width, true);
  const Id gx3 = r.gemm(n, r.H(), width, true);
  r.accumulate(gx, gx3);
  // Weight gradients, projection by projection and expert by expert, each added into .grad.
  const Id a = r.ew(act, 2);  // silu * h3, for the down projection's gradient
  for (int w = 0; w < 3; ++w) {
    for (const int64_t rows : expert_split(r)) {
      const Id gw = r.gemm(w == 0 ? r.H() : width, w == 0 ? width : r.H(), rows * r.s.etp, true);
      r.t.costs().memory_bytes += 3.0 * double(width * r.H() * r.e);
      r.drop(gw);
    }
    if (w == 0) r.drop(a);
  }
  for (Id t : {silu, dh1, dh3, g.h1, g.h3, g.rows}) r.drop(t);
  return gx;
}

}  // namespace trainer::model::replays
