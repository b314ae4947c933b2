#include "model/layers_replay.h"

#include <algorithm>
#include <numeric>

namespace trainer::model::replays {

namespace {

// silu(gate) * up: a silu temporary and the product, or one pass of kernels/swiglu.
Id swiglu_product(Replay& r, int64_t act) {
  if (r.s.fused.swiglu) return r.ew(act, 2);
  const Id silu = r.ew(act);
  const Id product = r.ew(act, 2);
  r.drop(silu);
  return product;
}

// d gate and d up from the product's gradient: silu again, two muls and silu's backward, or one
// pass of kernels/swiglu reading g, gate and up.
std::pair<Id, Id> swiglu_grads(Replay& r, int64_t act) {
  if (r.s.fused.swiglu) {
    const Id ggate = r.ew(act, 1.5);
    const Id gup = r.ew(act, 1.5);
    return {ggate, gup};
  }
  const Id silu = r.ew(act);
  const Id gup = r.ew(act, 2);
  r.drop(silu);
  const Id t = r.ew(act, 2);
  const Id ggate = r.ew(act, 2);
  r.drop(t);
  return {ggate, gup};
}

Id mlp_forward_lean(Replay& r, Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m) {
  m.rows = rows;
  m.width = width;
  m.in = saved;
  m.regather = saved != x;
  r.hold(saved);  // gate and up save it once (column_parallel_linear)
  m.gate = r.gemm(rows, width, r.H());
  m.up = r.gemm(rows, width, r.H());
  const Id product = swiglu_product(r, rows * width * r.e);
  const Id out = row_output(r, rows, r.H(), width);
  r.drop(product);
  return out;
}

Id mlp_backward_lean(Replay& r, Id g, MlpSaved& m, bool reduce) {
  const int64_t rows = m.rows, width = m.width, act = rows * width * r.e;
  // The down projection's weight gradient first, from the product computed again; with the
  // collective matmul the input gradients first (g W_down came with the gather of g).
  const auto down_weight_grad = [&] {
    const Id product = swiglu_product(r, act);
    weight_grad(r, r.H(), width, rows);
    r.drop(product);
  };
  if (!r.tp_ring()) down_weight_grad();
  const Id gprod = r.gemm(rows, width, r.H());  // g W_down
  // d up = g * silu(gate) (silu again, a temporary), d gate = silu_backward(g * up, gate).
  const auto [ggate, gup] = swiglu_grads(r, act);
  r.drop(gprod);
  if (r.tp_ring()) down_weight_grad();
  r.drop(m.gate);
  r.drop(m.up);
  return column_backward(r, {ggate, gup}, {width, width}, m.in, rows, m.regather, reduce);
}

// autograd's graph (not lean): gate, silu(gate), up and the product saved.
Id mlp_forward_graph(Replay& r, Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m) {
  m.rows = rows;
  m.width = width;
  m.in = saved;
  m.regather = saved != x;
  r.hold(saved);  // gate and up save it once (column_parallel_linear)
  m.gate = r.gemm(rows, width, r.H());
  if (!r.s.fused.swiglu) m.silu = r.ew(rows * width * r.e);  // the fused function saves gate and up only
  m.up = r.gemm(rows, width, r.H());
  m.mul = r.ew(rows * width * r.e, 2);
  return row_output(r, rows, r.H(), width);
}

Id mlp_backward_graph(Replay& r, Id g, MlpSaved& m, bool reduce) {
  const int64_t rows = m.rows, width = m.width, act = rows * width * r.e;
  const Id gmul = linear_backward(r, g, rows, r.H(), width, m.mul, /*drop_grad=*/false);
  if (r.s.fused.swiglu) {
    const auto [ggate, gup] = swiglu_grads(r, act);
    r.drop(gmul);
    r.drop(m.up);
    r.drop(m.gate);
    return column_backward(r, {ggate, gup}, {width, width}, m.in, rows, m.regather, reduce);
  }
  const Id gsilu = r.ew(act, 2);  // g * up
  const Id gup = r.ew(act, 2);    // g * silu
  r.drop(gmul);
  r.drop(m.silu);
  r.drop(m.up);
  const Id ggate = r.ew(act, 2);  // silu backward
  r.drop(gsilu);
  r.drop(m.gate);
  return column_backward(r, {ggate, gup}, {width, width}, m.in, rows, m.regather, reduce);
}

}  // namespace

Id mlp_forward(Replay& r, Id x, Id saved, int64_t rows, int64_t width, MlpSaved& m, bool lean_mlp) {
  m.lean = lean_mlp;
  return lean_mlp ? mlp_forward_lean(r, x, saved, rows, width, m) : mlp_forward_graph(r, x, saved, rows, width, m);
}

Id mlp_backward(Replay& r, Id g, MlpSaved& m, bool reduce) {
  return m.lean ? mlp_backward_lean(r, g, m, reduce) : mlp_backward_graph(r, g, m, reduce);
}

Id mlp_nograd(Replay& r, Id x, int64_t rows, int64_t width) {
  const Id gate = r.gemm(rows, width, r.H());
  const Id up = r.gemm(rows, width, r.H());
  const Id mul = swiglu_product(r, rows * width * r.e);
  const Id down = row_output(r, rows, r.H(), width);
  r.drop(mul);
  r.drop(gate);
  r.drop(up);
  (void)x;
  return down;
}

}  // namespace trainer::model::replays
