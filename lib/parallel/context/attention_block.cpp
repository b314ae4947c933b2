#include "parallel/context/attention_block.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <tuple>

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

// The blocks run on the CPU kernel or, on CUDA, the flash kernel, which takes 16-bit inputs whose
// head size is a multiple of 8, at most 256.
void check_inputs(const at::Tensor& q) {
  if (q.is_cuda()) {
    const auto t = q.scalar_type();
    const int64_t d = q.size(-1);
    if ((t != at::kBFloat16 && t != at::kHalf) || d % 8 != 0 || d > 256)
      throw std::logic_error(fmt::format("ring attention on a GPU runs the flash kernel, which takes bf16 or fp16 and "
                                         "a head size that is a multiple of 8 up to 256; found {} with head size {}",
                                         c10::toString(t), d));
  } else if (!q.device().is_cpu()) {
    throw std::logic_error(fmt::format("ring attention's blocks run on the CPU or CUDA; found a tensor on {}",
                                       q.device().str()));
  }
}

}  // namespace

BlockAttention attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  check_inputs(q);
  const int64_t heads = q.size(1);
  if (q.is_cuda()) {
    // (out, lse, cumulative lengths, max lengths, philox seed and offset, debug mask)
    const auto r = at::_scaled_dot_product_flash_attention(q, expand_heads(k, heads), expand_heads(v, heads),
                                                           /*dropout_p=*/0.0, causal);
    return {std::get<0>(r), std::get<1>(r)};
  }
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, expand_heads(k, heads), expand_heads(v, heads),
                                                                    /*dropout_p=*/0.0, causal);
  return {out, lse};
}

BlockGradients attend_block_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool causal) {
  check_inputs(q);
  const int64_t heads = q.size(1);
  at::Tensor dq, dk, dv;
  if (q.is_cuda()) {
    // Not variable-length (no cumulative lengths) and without dropout (the seed and offset are
    // not read; empty, as the forward returns them then). The kernel indexes the log-sum-exp as a
    // contiguous [B, h, Lq] (ATen makes out and grad_out contiguous, not it): ring attention hands
    // in row slices of the whole rows' log-sum-exp.
    const at::Tensor none, unused = at::empty({}, at::TensorOptions().dtype(at::kLong));
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_backward(
        grad_out, q, expand_heads(k, heads), expand_heads(v, heads), out, lse.contiguous(), none, none, q.size(2),
        k.size(2), /*dropout_p=*/0.0, causal, unused, unused);
  } else {
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, expand_heads(k, heads), expand_heads(v, heads), out, lse, /*dropout_p=*/0.0, causal);
  }
  return {dq, sum_groups(dk, k.size(1)), sum_groups(dv, v.size(1))};
}

int64_t band_rows(Band band, int64_t Lq, int64_t Lk) {
  if (band.offset < 0 || band.window < 1)
    throw std::logic_error(fmt::format("attention band with offset {} and window {}: expected keys not in the future "
                                       "and a window of at least one token",
                                       band.offset, band.window));
  // Row i attends keys [i + offset - window + 1, i + offset]: some of [0, Lk) while the first is < Lk.
  return std::clamp<int64_t>(Lk - 1 - band.offset + band.window, 0, Lq);
}

at::Tensor band_mask(Band band, int64_t Lq, int64_t Lk, const at::TensorOptions& options) {
  // Broadcast comparisons: two boolean [Lq, Lk] temporaries besides the mask (the estimator's
  // replay counts them, attention_replay.cpp).
  const auto index = at::TensorOptions().dtype(at::kLong).device(options.device());
  const at::Tensor query = at::arange(Lq, index).unsqueeze(1) + band.offset;  // positions relative to the first key
  const at::Tensor key = at::arange(Lk, index).unsqueeze(0);
  const at::Tensor outside = key.gt(query).logical_or_(key.le(query - band.window));
  return at::zeros({Lq, Lk}, options).masked_fill_(outside, -std::numeric_limits<double>::infinity());
}

namespace {

// The flash kernel's window for the band on an Lq x Lk block: it lets query i attend keys
// [i + Lk - Lq - left, i + Lk - Lq + right] (bottom-right aligned), which is the band's
// [i + offset - window + 1, i + offset] for these (both >= 0 when Lq = band_rows).
std::pair<int64_t, int64_t> flash_window(Band band, int64_t Lq, int64_t Lk) {
  const int64_t shift = Lk - Lq;
  const int64_t left = shift - band.offset + band.window - 1, right = band.offset - shift;
  // Negative is not a bound the kernel takes (-1 means none): only band_rows' leading rows come here.
  if (left < 0 || right < 0)
    throw std::logic_error(fmt::format("attention band (offset {}, window {}) over a {} x {} block has no flash "
                                       "window (left {}, right {}): pass only band_rows' rows",
                                       band.offset, band.window, Lq, Lk, left, right));
  return {left >= Lk ? -1 : left, right >= Lk ? -1 : right};
}

}  // namespace

BlockAttention attend_band(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Band band) {
  check_inputs(q);
  const int64_t heads = q.size(1), Lq = q.size(2), Lk = k.size(2);
  if (q.is_cuda()) {
    // [B, L, h, d] views for the kernel, which takes grouped-query key/value heads as they are.
    const auto [left, right] = flash_window(band, Lq, Lk);
    const auto r = at::_flash_attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), std::nullopt,
                                                std::nullopt, Lq, Lk, /*dropout_p=*/0.0, /*is_causal=*/false,
                                                /*return_debug_mask=*/false, std::nullopt, left, right);
    return {std::get<0>(r).transpose(1, 2), std::get<1>(r)};
  }
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      q, expand_heads(k, heads), expand_heads(v, heads), /*dropout_p=*/0.0, /*is_causal=*/false,
      band_mask(band, Lq, Lk, q.options()).view({1, 1, Lq, Lk}));
  return {out, lse};
}

BlockGradients attend_band_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, Band band) {
  check_inputs(q);
  const int64_t heads = q.size(1), Lq = q.size(2), Lk = k.size(2);
  if (q.is_cuda()) {
    const auto [left, right] = flash_window(band, Lq, Lk);
    const at::Tensor none, unused = at::empty({}, at::TensorOptions().dtype(at::kLong));
    auto [dq, dk, dv] = at::_flash_attention_backward(
        grad_out.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out.transpose(1, 2),
        lse.contiguous(), none, none, Lq, Lk, /*dropout_p=*/0.0, /*is_causal=*/false, unused, unused, std::nullopt,
        left, right);
    return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
  }
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, q, expand_heads(k, heads), expand_heads(v, heads), out, lse, /*dropout_p=*/0.0, /*is_causal=*/false,
      band_mask(band, Lq, Lk, q.options()).view({1, 1, Lq, Lk}));
  return {dq, sum_groups(dk, k.size(1)), sum_groups(dv, v.size(1))};
}

namespace {

// The masked block's scores in the accumulation dtype: [B, h, Lq, Lk], -inf where masked.
at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask) {
  const auto type = at::promote_types(q.scalar_type(), at::kFloat);
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  const at::Tensor scores = at::matmul(q.to(type), expand_heads(k, q.size(1)).to(type).transpose(-2, -1)).mul_(scale);
  return scores.masked_fill_(mask.logical_not(), -std::numeric_limits<double>::infinity());
}

// exp(scores - lse) with the rows whose lse is -inf (no key) all zeros, not NaN.
at::Tensor probabilities(const at::Tensor& scores, const at::Tensor& lse) {
  const at::Tensor finite = at::where(at::isinf(lse), at::zeros_like(lse), lse);
  return at::exp(scores - finite.unsqueeze(-1));
}

}  // namespace

BlockAttention attend_masked(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const at::Tensor scores = masked_scores(q, k, mask);
  const at::Tensor lse = at::logsumexp(scores, -1);
  const at::Tensor p = probabilities(scores, lse);
  return {at::matmul(p, expand_heads(v, q.size(1)).to(p.scalar_type())), lse};
}

BlockGradients attend_masked_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                      const at::Tensor& mask) {
  const int64_t heads = q.size(1);
  const at::Tensor p = probabilities(masked_scores(q, k, mask), lse.to(at::promote_types(q.scalar_type(), at::kFloat)));
  const auto type = p.scalar_type();
  const at::Tensor g = grad_out.to(type), key = expand_heads(k, heads).to(type), value = expand_heads(v, heads).to(type);
  // Softmax backward with the final output: dS = P * (dP - rowsum(dO * O)).
  const at::Tensor row = (g * out.to(type)).sum(-1, /*keepdim=*/true);
  const at::Tensor ds = p * (at::matmul(g, value.transpose(-2, -1)) - row);
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  const at::Tensor dq = at::matmul(ds, key).mul_(scale);
  const at::Tensor dk = at::matmul(ds.transpose(-2, -1), q.to(type)).mul_(scale);
  const at::Tensor dv = at::matmul(p.transpose(-2, -1), g);
  return {dq, sum_groups(dk, k.size(1)), sum_groups(dv, v.size(1))};
}

void merge_block(at::Tensor& out, at::Tensor& lse, const BlockAttention& part) {
  const at::Tensor part_lse = part.lse.to(lse.scalar_type());
  const at::Tensor merged = at::logaddexp(lse, part_lse);
  // A row that has attended no key yet and none in this part either stays 0 with -inf (not NaN).
  const at::Tensor base = at::where(at::isinf(merged), at::zeros_like(merged), merged);
  out.mul_(at::exp(lse - base).unsqueeze(-1)).add_(part.out.to(out.scalar_type()) * at::exp(part_lse - base).unsqueeze(-1));
  lse.copy_(merged);
}

}  // namespace trainer::parallel
