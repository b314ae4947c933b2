#include "model/rotary.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace trainer::model {

std::vector<double> rotary_inverse_frequencies(int64_t head_dim, double theta,
                                               const std::optional<recipe::RopeScaling>& scaling) {
  std::vector<double> inv(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) inv[i] = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
  if (!scaling) return inv;
  if (scaling->rope_type == recipe::RopeType::Linear) {
    for (auto& f : inv) f /= scaling->factor;
    return inv;
  }
  if (scaling->rope_type == recipe::RopeType::Yarn) {
    // transformers' _compute_yarn_parameters: dimension pairs that turn more than beta_fast times
    // over the original context keep their frequency, fewer than beta_slow are divided by factor,
    // a linear ramp over the pairs between (computed in fp32 there; the frequencies are fp32 here
    // too once Rotary stores them).
    const double dim = double(head_dim), context = double(scaling->original_max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(context / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = correction_dim(scaling->beta_fast), high = correction_dim(scaling->beta_slow);
    if (scaling->truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // no singularity
    for (size_t i = 0; i < inv.size(); ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // the share of the unscaled frequency
      inv[i] = inv[i] / scaling->factor * (1.0 - extrapolation) + inv[i] * extrapolation;
    }
    return inv;
  }
  // llama3: low frequencies (long wavelengths) are divided by factor, high ones kept, and the
  // band between interpolated smoothly (transformers' _compute_llama3_parameters).
  const double old_context = double(scaling->original_max_position_embeddings);
  const double low_freq_wavelen = old_context / scaling->low_freq_factor;
  const double high_freq_wavelen = old_context / scaling->high_freq_factor;
  for (auto& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      f /= scaling->factor;
      continue;
    }
    const double smooth =
        (old_context / wavelen - scaling->low_freq_factor) / (scaling->high_freq_factor - scaling->low_freq_factor);
    f = (1 - smooth) * f / scaling->factor + smooth * f;
  }
  return inv;
}

double rotary_attention_factor(const std::optional<recipe::RopeScaling>& scaling) {
  if (!scaling || scaling->rope_type != recipe::RopeType::Yarn) return 1.0;
  if (scaling->attention_factor) return *scaling->attention_factor;
  auto mscale = [f = scaling->factor](double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; };
  if (scaling->mscale.value_or(0) != 0 && scaling->mscale_all_dim.value_or(0) != 0)
    return mscale(*scaling->mscale) / mscale(*scaling->mscale_all_dim);
  return mscale(1.0);
}

Rotary::Rotary(int64_t head_dim, double theta, const std::optional<recipe::RopeScaling>& scaling)
    : attention_factor_(rotary_attention_factor(scaling)) {
  const auto inv = rotary_inverse_frequencies(head_dim, theta, scaling);
  inverse_frequencies_ = at::tensor(inv, at::kDouble).to(at::kFloat);
}

std::pair<at::Tensor, at::Tensor> Rotary::cos_sin(const at::Tensor& positions, c10::ScalarType dtype) const {
  const at::Tensor inv = inverse_frequencies_.to(positions.device());
  const at::Tensor freqs = at::outer(positions.to(at::kFloat), inv);  // [T, d/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                  // [T, d]
  if (attention_factor_ != 1.0)  // yarn: as transformers scales them, in fp32 before the cast
    return {(emb.cos() * attention_factor_).to(dtype), (emb.sin() * attention_factor_).to(dtype)};
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor Rotary::apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half);
  const at::Tensor x2 = x.narrow(-1, half, half);
  const at::Tensor rotated = at::cat({-x2, x1}, -1);
  return x * cos + rotated * sin;
}

}  // namespace trainer::model
