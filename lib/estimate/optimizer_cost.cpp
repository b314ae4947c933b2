#include "estimate/optimizer_cost.h"

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
      // Muon's momentum on matrices (the embedding and LM head take AdamW: counted as matrices here).
      c.matrix_bytes = 4;
      c.vector_bytes = 2 * s;
      c.step_bytes = common + 4 + 8 + 16;
      break;
  }
  return c;
}

}  // namespace trainer::estimate
