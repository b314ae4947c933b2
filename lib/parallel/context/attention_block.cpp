#include "parallel/context/attention_block.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

namespace trainer::parallel {

namespace {

// The kernels take as many key/value heads as query heads: kv heads repeated for their groups.
at::Tensor expand_heads(const at::Tensor& kv, int64_t heads) {
  const int64_t groups = heads / kv.size(1);
  return groups == 1 ? kv : kv.repeat_interleave(groups, 1);
}

// The gradient of repeated heads: each kv head's groups summed.
at::Tensor sum_groups(const at::Tensor& grad, int64_t kv_heads) {
  const int64_t groups = grad.size(1) / kv_heads;
  if (groups == 1) return grad;
  return grad.unflatten(1, {kv_heads, groups}).sum(2);
}

void check_device(const at::Tensor& q) {
  if (!q.device().is_cpu())
    throw std::logic_error(fmt::format("ring attention runs its blocks on the CPU kernel only; found a tensor on {}",
                                       q.device().str()));
}

}  // namespace

BlockAttention attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  check_device(q);
  const int64_t heads = q.size(1);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, expand_heads(k, heads), expand_heads(v, heads),
                                                                    /*dropout_p=*/0.0, causal);
  return {out, lse};
}

BlockGradients attend_block_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool causal) {
  check_device(q);
  const int64_t heads = q.size(1);
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, q, expand_heads(k, heads), expand_heads(v, heads), out, lse, /*dropout_p=*/0.0, causal);
  return {dq, sum_groups(dk, k.size(1)), sum_groups(dv, v.size(1))};
}

void merge_block(at::Tensor& out, at::Tensor& lse, const BlockAttention& part) {
  const at::Tensor part_lse = part.lse.to(lse.scalar_type());
  const at::Tensor merged = at::logaddexp(lse, part_lse);
  out.mul_(at::exp(lse - merged).unsqueeze(-1)).add_(part.out.to(out.scalar_type()) * at::exp(part_lse - merged).unsqueeze(-1));
  lse.copy_(merged);
}

}  // namespace trainer::parallel
