#include "model/rotary.h"

#include <ATen/ATen.h>

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

Rotary::Rotary(int64_t head_dim, double theta, const std::optional<recipe::RopeScaling>& scaling) {
  const auto inv = rotary_inverse_frequencies(head_dim, theta, scaling);
  inverse_frequencies_ = at::tensor(inv, at::kDouble).to(at::kFloat);
}

std::pair<at::Tensor, at::Tensor> Rotary::cos_sin(const at::Tensor& positions, c10::ScalarType dtype) const {
  const at::Tensor inv = inverse_frequencies_.to(positions.device());
  const at::Tensor freqs = at::outer(positions.to(at::kFloat), inv);  // [T, d/2]
  const at::Tensor emb = at::cat({freqs, freqs}, -1);                  // [T, d]
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
