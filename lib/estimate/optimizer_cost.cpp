#include "estimate/optimizer_cost.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace trainer::estimate {

OptimizerCost optimizer_cost(const recipe::OptimizerConfig& o, int64_t e) {
  OptimizerCost c;
  c.master_bytes = e == 4 ? 0 : 4;
  const double s = double(recipe::bytes_of(o.state_dtype));
  // Around every optimizer: gradient norm (read), clipping (read, write), fp32 gradient copy (bf16
  // only), copy back to the bf16 weights, zero_grad.
  const double common = e == 4 ? 4 + 8 + 4 : 2 + 4 + (2 + 4) + (4 + 2) + 2;
  switch (o.name) {
    case recipe::OptimizerName::AdamW:
      c.matrix_bytes = c.vector_bytes = 2 * s;
      // The fused update reads gradient, master and moments and writes master and moments; bf16
      // moments are widened to fp32 copies first and rounded back after.
      c.step_bytes = common + 4 + 8 + (s == 4 ? 16 : 4 + 8 + 16 + 8 + 4);
      if (s != 4) {
        c.transient_bytes_per_element = 8;
        c.transient_elements_cap = double(int64_t(64) << 20) / 8;
      }
      break;
    case recipe::OptimizerName::AdamW8bit:
      // Two code bytes and two fp32 maxima per block of 256. Its step is written out as separate
      // element-wise operations in two passes (block maxima, then the update and quantisation):
      // about 760 bytes of traffic per element, counted operation by operation in
      // docs/estimator.md; a fused kernel would need about 20.
      c.matrix_bytes = 2 + 8.0 / 256;
      c.vector_bytes = 8;
      c.step_bytes = common + 760;
      c.transient_bytes_per_element = 40;
      c.transient_bytes_whole_blocks = 28;
      c.transient_elements_cap = double(int64_t(1) << 22);
      c.transient_per_tensor = true;
      break;
    case recipe::OptimizerName::Lion:
      c.matrix_bytes = c.vector_bytes = s;
      c.step_bytes = common + 110;  // about a dozen element-wise operations over fp32 values
      // Per tensor: the momentum widened (bf16), the direction and the products of the blend.
      c.transient_bytes_per_element = s == 4 ? 16 : 20;
      c.transient_elements_cap = 1e18;
      c.transient_per_tensor = true;
      break;
    case recipe::OptimizerName::Muon:
      // A momentum on the layer matrices; AdamW's moments on the rest. The matrices' step: the
      // momentum and the Nesterov input (about 40 bytes of element-wise traffic), the update (12);
      // the Newton-Schulz products are compute (muon_work).
      c.matrix_bytes = s;
      c.table_bytes = c.vector_bytes = 2 * s;
      c.step_bytes = common + 52;
      if (s != 4) {
        c.transient_bytes_per_element = 8;  // the tables' bf16 moments widened, as AdamW's
        c.transient_elements_cap = double(int64_t(64) << 20) / 8;
      }
      c.matrix_inputs_bytes = 4;
      c.matrix_exchange_bytes = 8;
      break;
  }
  if (o.name != recipe::OptimizerName::Muon) c.table_bytes = c.matrix_bytes;
  return c;
}

MuonWork muon_work(const recipe::Recipe& r) {
  const auto& m = r.model;
  MuonWork w;
  double largest = 0, largest_side = 0;
  const auto ns = [&](const std::vector<std::pair<int64_t, int64_t>>& matrices) {
    double flops = 0;
    for (const auto& [rows, cols] : matrices) {
      const double a = double(std::min(rows, cols)), b = double(std::max(rows, cols));
      flops += 4 * a * a * b + 2 * a * a * a;
      if (a * b > largest) {
        largest = a * b;
        largest_side = a;
      }
    }
    return flops * double(r.optimizer.muon.ns_steps);
  };
  const int64_t H = m.hidden_size, heads = m.num_attention_heads;
  const int64_t kv = m.num_key_value_heads > 0 ? m.num_key_value_heads : heads;
  const int64_t hd = m.head_dim > 0 ? m.head_dim : (heads > 0 ? H / heads : 0);
  if (m.mla) {
    const auto& a = *m.mla;
    const int64_t q_lora = a.q_lora_rank.value_or(0), qk = a.qk_head_dim();
    std::vector<std::pair<int64_t, int64_t>> attention = {
        {a.kv_lora_rank + a.qk_rope_head_dim, H},
        {heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank},
        {H, heads * a.v_head_dim}};
    if (q_lora > 0) {
      attention.push_back({q_lora, H});
      attention.push_back({heads * qk, q_lora});
    } else {
      attention.push_back({heads * qk, H});
    }
    w.attention = ns(attention);
  } else {
    w.attention = ns({{heads * hd, H}, {kv * hd, H}, {kv * hd, H}, {H, heads * hd}});
  }
  const auto swiglu = [&](int64_t width) { return width > 0 ? ns({{width, H}, {width, H}, {H, width}}) : 0.0; };
  w.dense_mlp = swiglu(m.intermediate_size);
  if (m.moe) {
    const int64_t width = m.moe->moe_intermediate_size > 0 ? m.moe->moe_intermediate_size : m.intermediate_size;
    w.expert = swiglu(width);
    w.shared_experts = swiglu(m.moe->num_shared_experts * width);
  }
  // The iteration on the largest matrix: the normalised input, X X^T, its square, the polynomial,
  // and the new X beside the old (about 4 matrices and 3 squares of the smaller side).
  w.largest_temporaries = 4.0 * (4 * largest + 3 * largest_side * largest_side);
  return w;
}

}  // namespace trainer::estimate
