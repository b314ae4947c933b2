#include "model/parallel_linear_replay.h"

#include <algorithm>
#include <numeric>

namespace trainer::model::replays {

Id linear_backward(Replay& r, Id g, int64_t m, int64_t n, int64_t k, Id saved, bool drop_grad) {
  const Id gx = r.gemm(m, k, n);  // dx = g W
  weight_grad(r, n, k, m);         // dW = g^T x
  if (drop_grad) r.drop(g);
  r.drop(saved);
  return gx;
}

void weight_grad(Replay& r, int64_t n, int64_t k, int64_t m) {
  if (r.s.fused.grad_accumulation && r.e != kF32) return r.gemm_into_f32(n, k, m);
  const Id gw = r.gemm(n, k, m);
  r.t.costs().memory_bytes += 3.0 * double(n * k * r.e);  // .grad += dW
  r.drop(gw);
}

Id column_backward(Replay& r, const std::vector<Id>& gs, const std::vector<int64_t>& widths, Id saved, int64_t rows,
                   bool regather, bool reduce) {
  const int64_t k = r.H();
  Id regathered = Timeline::kNone;
  size_t gather = 0;
  if (regather) {
    gather = r.comm(CommKind::AllGather, CommGroup::Tp, rows * k * r.e);
    regathered = r.alloc(rows * k * r.e);
  }
  const size_t dx_mark = r.gemm_mark();
  Id sum = Timeline::kNone;
  for (const int64_t n : widths) {
    const Id gx = r.gemm(rows, k, n);  // dx_i = g_i W_i, summed in place
    if (sum == Timeline::kNone)
      sum = gx;
    else
      r.accumulate(sum, gx);
  }
  if (regather) r.behind(gather, dx_mark);
  reduce = reduce && r.s.tp > 1;
  const size_t reduction =
      reduce ? r.comm(r.sp() ? CommKind::ReduceScatter : CommKind::AllReduce, CommGroup::Tp, rows * k * r.e) : 0;
  const size_t dw_mark = r.gemm_mark();
  for (const int64_t n : widths) weight_grad(r, n, k, rows);  // dW_i = g_i^T x
  if (reduce) r.behind(reduction, dw_mark);
  for (const Id g : gs) r.drop(g);
  r.drop(saved);
  r.drop(regathered);
  if (!reduce || !r.sp()) return sum;
  const Id res = r.alloc(r.Tn() * k * r.e);
  r.drop(sum);
  return res;
}

namespace {

// [T, H] partial sums summed over tp: all-reduced in place, or reduce-scattered (sp) into [Tn, H].
Id sum_over_tp(Replay& r, Id y) {
  if (r.s.tp <= 1) return y;
  if (!r.sp()) {
    r.comm(CommKind::AllReduce, CommGroup::Tp, r.T() * r.H() * r.e);
    return y;
  }
  r.comm(CommKind::ReduceScatter, CommGroup::Tp, r.T() * r.H() * r.e);
  const Id res = r.alloc(r.Tn() * r.H() * r.e);
  r.drop(y);
  return res;
}

}  // namespace

Id gather_input(Replay& r, Id x, int gemms) {
  if (!r.sp()) return x;
  const size_t gather = r.comm(CommKind::AllGather, CommGroup::Tp, r.T() * r.H() * r.e);
  if (gemms == 0 || !r.tp_ring()) return r.alloc(r.T() * r.H() * r.e);
  r.ring(gather, gemms);
  return r.alloc((r.s.tp > 2 ? 2 : 1) * r.Tn() * r.H() * r.e);  // the chunk arriving (and the one held)
}

Id row_output(Replay& r, int64_t rows, int64_t n, int64_t k) {
  if (!r.tp_ring()) return sum_over_tp(r, r.gemm(rows, n, k));
  const int64_t chunk_rows = rows / r.s.tp, chunk = chunk_rows * n * r.e;
  const size_t ring = r.comm(CommKind::ReduceScatter, CommGroup::Tp, rows * n * r.e);
  r.ring(ring, 0);
  Id sum = r.gemm(chunk_rows, n, k);
  for (int64_t step = 1; step < r.s.tp; ++step) {
    const Id received = r.alloc(chunk);
    const size_t mark = r.gemm_mark();
    const Id mine = r.gemm(chunk_rows, n, k);  // while the running sum travels
    if (step == 1) r.behind(ring, mark);        // every step has one chunk behind it
    r.drop(sum);
    r.accumulate(received, mine);  // received += mine
    sum = received;
  }
  return sum;
}

Id reduce_grad(Replay& r, Id g) { return sum_over_tp(r, g); }

Id gather_grad_copy(Replay& r, Id g) {
  if (!r.sp()) return g;
  const size_t gather = r.comm(CommKind::AllGather, CommGroup::Tp, r.T() * r.H() * r.e);
  if (r.tp_ring()) r.ring(gather, 1);
  return r.alloc(r.T() * r.H() * r.e);
}

}  // namespace trainer::model::replays
