// Rotary embeddings in the Hugging Face Llama convention, on known values.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>

#include "model/rotary.h"
#include "model_test_util.h"

using namespace trainer;

TEST_CASE("inverse frequencies are 1 / theta^(2i/d)", "[model][rotary]") {
  const auto inv = model::rotary_inverse_frequencies(8, 10000.0, std::nullopt);
  REQUIRE(inv.size() == 4);
  // 10000^(0/8, 2/8, 4/8, 6/8) = 1, 10, 100, 1000.
  const std::vector<double> expected = {1.0, 0.1, 0.01, 0.001};
  for (size_t i = 0; i < 4; ++i) CHECK(inv[i] == Approx(expected[i]).epsilon(1e-14));
  recipe::RopeScaling linear;
  linear.rope_type = recipe::RopeType::Linear;
  linear.factor = 4.0;
  const auto scaled = model::rotary_inverse_frequencies(8, 10000.0, linear);
  for (size_t i = 0; i < 4; ++i) CHECK(scaled[i] == Approx(expected[i] / 4).epsilon(1e-14));
}

TEST_CASE("cos_sin is cos/sin of position times inverse frequency duplicated over both halves", "[model][rotary]") {
  model::Rotary rotary(8, 10000.0, std::nullopt);
  const std::vector<int64_t> positions = {0, 1, 5};
  auto [cos, sin] = rotary.cos_sin(at::tensor(positions, at::kLong), at::kDouble);
  REQUIRE(cos.sizes().vec() == std::vector<int64_t>{3, 8});
  REQUIRE(sin.sizes().vec() == std::vector<int64_t>{3, 8});
  CHECK(cos.scalar_type() == at::kDouble);
  const std::vector<double> inv = {1.0, 0.1, 0.01, 0.001};
  for (size_t t = 0; t < positions.size(); ++t)
    for (int i = 0; i < 8; ++i) {
      const double angle = double(positions[t]) * inv[i % 4];  // column i and i + 4 share a frequency
      CHECK(cos[t][i].item<double>() == Approx(std::cos(angle)).margin(1e-6));
      CHECK(sin[t][i].item<double>() == Approx(std::sin(angle)).margin(1e-6));
    }
  // Position 0 is the identity rotation.
  CHECK(at::equal(cos[0], at::ones({8}, at::kDouble)));
  CHECK(at::equal(sin[0], at::zeros({8}, at::kDouble)));
  // Another dtype: the same values rounded.
  auto [cos16, sin16] = rotary.cos_sin(at::tensor(positions, at::kLong), at::kBFloat16);
  CHECK(cos16.scalar_type() == at::kBFloat16);
  CHECK(at::allclose(cos16.to(at::kDouble), cos, 0, 1e-2));
}

TEST_CASE("Rotary::apply is x cos + rotate_half(x) sin on a hand vector", "[model][rotary]") {
  // head_dim 4: rotate_half([a, b, c, d]) = [-c, -d, a, b].
  const double a = 1.0, b = 2.0, c = 3.0, d = 4.0;
  const at::Tensor x = at::tensor({a, b, c, d}, at::kDouble).view({1, 1, 1, 4});  // [B, heads, T, d]
  const double c0 = 0.6, s0 = 0.8, c1 = -0.28, s1 = 0.96;  // two angles' cos/sin (c^2 + s^2 = 1)
  const at::Tensor cos = at::tensor({c0, c1, c0, c1}, at::kDouble).view({1, 4});
  const at::Tensor sin = at::tensor({s0, s1, s0, s1}, at::kDouble).view({1, 4});
  const at::Tensor y = model::Rotary::apply(x, cos, sin).view({-1});
  // [a c0 - c s0, b c1 - d s1, c c0 + a s0, d c1 + b s1]
  const std::vector<double> expected = {1 * 0.6 - 3 * 0.8, 2 * -0.28 - 4 * 0.96, 3 * 0.6 + 1 * 0.8,
                                        4 * -0.28 + 2 * 0.96};
  for (int i = 0; i < 4; ++i) CHECK(y[i].item<double>() == Approx(expected[i]).epsilon(1e-14));
}

TEST_CASE("rotary scores depend only on the relative position", "[model][rotary]") {
  model::Rotary rotary(8, 10000.0, std::nullopt);
  auto [cos, sin] = rotary.cos_sin(at::arange(12, at::kLong), at::kDouble);
  const at::Tensor q = model_test::randn({1, 1, 1, 8}, 1).expand({1, 1, 12, 8});
  const at::Tensor k = model_test::randn({1, 1, 1, 8}, 2).expand({1, 1, 12, 8});
  const at::Tensor rq = model::Rotary::apply(q, cos, sin)[0][0];
  const at::Tensor rk = model::Rotary::apply(k, cos, sin)[0][0];
  // <R(p) q, R(s) k> for (p, s) = (3, 1) and (10, 8); norms are preserved.
  CHECK(at::dot(rq[3], rk[1]).item<double>() == Approx(at::dot(rq[10], rk[8]).item<double>()).epsilon(1e-5));
  CHECK(rq[7].norm().item<double>() == Approx(q[0][0][0].norm().item<double>()).epsilon(1e-6));
}

namespace {
// transformers' _compute_llama3_parameters, written independently: per frequency, its wavelength
// decides keep / divide / interpolate.
double llama3_reference(int64_t i, int64_t head_dim, double theta, double factor, double low, double high,
                        double original) {
  const double freq = std::pow(theta, -double(2 * i) / double(head_dim));
  const double wavelen = 2 * M_PI / freq;
  const double low_freq_wavelen = original / low, high_freq_wavelen = original / high;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / factor;
  const double smooth = (original / wavelen - low) / (high - low);
  return (1 - smooth) * freq / factor + smooth * freq;
}
}  // namespace

TEST_CASE("llama3 rope scaling matches the transformers formula", "[model][rotary]") {
  recipe::RopeScaling scaling;  // defaults: llama3, factor 8, low 1, high 4, original 8192
  REQUIRE(scaling.rope_type == recipe::RopeType::Llama3);
  scaling.factor = 8.0;
  scaling.low_freq_factor = 1.0;
  scaling.high_freq_factor = 4.0;
  scaling.original_max_position_embeddings = 8192;
  const auto inv = model::rotary_inverse_frequencies(128, 500000.0, scaling);
  REQUIRE(inv.size() == 64);
  // Wavelength 2*pi*500000^(i/64) is below 8192/4 = 2048 for i <= 28 (kept), above 8192 for
  // i >= 35 (divided by 8); 29..34 are interpolated.
  auto unscaled = [](int64_t i) { return std::pow(500000.0, -double(2 * i) / 128.0); };
  for (int64_t i : {0, 1, 10, 28}) {
    CAPTURE(i);
    CHECK(inv[i] == Approx(unscaled(i)).epsilon(1e-12));
  }
  for (int64_t i : {35, 40, 63}) {
    CAPTURE(i);
    CHECK(inv[i] == Approx(unscaled(i) / 8).epsilon(1e-12));
  }
  for (int64_t i : {29, 31, 34}) {
    CAPTURE(i);
    CHECK(inv[i] < unscaled(i) * (1 - 1e-3));
    CHECK(inv[i] > unscaled(i) / 8 * (1 + 1e-3));
  }
  for (int64_t i = 0; i < 64; ++i) {
    CAPTURE(i);
    CHECK(inv[i] == Approx(llama3_reference(i, 128, 500000.0, 8.0, 1.0, 4.0, 8192.0)).epsilon(1e-12));
  }
  // Index 31 by hand: wavelen = 2*pi*500000^(31/64); smooth = (8192/wavelen - 1) / 3.
  const double f31 = unscaled(31), wavelen31 = 2 * M_PI / f31, smooth31 = (8192.0 / wavelen31 - 1) / 3;
  REQUIRE(smooth31 > 0);
  REQUIRE(smooth31 < 1);
  CHECK(inv[31] == Approx((1 - smooth31) * f31 / 8 + smooth31 * f31).epsilon(1e-12));
  // Rotary uses the scaled frequencies.
  model::Rotary rotary(128, 500000.0, scaling);
  auto [cos, sin] = rotary.cos_sin(at::tensor({3}, at::kLong), at::kDouble);
  for (int64_t i : {0, 31, 63}) {
    CHECK(cos[0][i].item<double>() == Approx(std::cos(3 * inv[i])).margin(1e-6));
    CHECK(sin[0][i + 64].item<double>() == Approx(std::sin(3 * inv[i])).margin(1e-6));
  }
}

TEST_CASE("yarn frequencies and attention factor are transformers' _compute_yarn_parameters", "[model][rotary]") {
  // Reference values printed by transformers 5.23 (ROPE_INIT_FUNCTIONS["yarn"]) for head_dim 16,
  // theta 10000, factor 40, original context 8, beta_fast 16, beta_slow 2, mscale 1, mscale_all_dim
  // 0.5: pairs 0..1 kept, 2..3 on the ramp, 4.. divided by 40 (fp32 there, hence 1e-6).
  recipe::RopeScaling yarn;
  yarn.rope_type = recipe::RopeType::Yarn;
  yarn.factor = 40.0;
  yarn.original_max_position_embeddings = 8;
  yarn.beta_fast = 16;
  yarn.beta_slow = 2;
  yarn.mscale = 1.0;
  yarn.mscale_all_dim = 0.5;
  const std::vector<double> expected = {1.000000000e+00, 7.905694656e-03, 2.499999944e-03, 7.905694656e-04,
                                        2.500000119e-04, 7.905694656e-05, 2.499999937e-05, 7.905694474e-06};
  const auto inv = model::rotary_inverse_frequencies(16, 10000.0, yarn);
  REQUIRE(inv.size() == expected.size());
  for (size_t i = 0; i < inv.size(); ++i) CHECK(inv[i] == Approx(expected[i]).epsilon(1e-6));
  CHECK(model::rotary_attention_factor(yarn) == Approx(1.1557219901962608).epsilon(1e-12));
  // Without mscale: 0.1 ln(factor) + 1; transformers' value for factor 4 is 1.138629436111989.
  yarn.mscale.reset();
  yarn.factor = 4.0;
  CHECK(model::rotary_attention_factor(yarn) == Approx(1.138629436111989).epsilon(1e-12));
  // cos and sin carry the factor.
  model::Rotary rotary(16, 10000.0, yarn);
  auto [cos, sin] = rotary.cos_sin(at::tensor(std::vector<int64_t>{0}, at::kLong), at::kDouble);
  CHECK(cos[0][0].item<double>() == Approx(1.138629436111989).epsilon(1e-6));
  CHECK(model::rotary_attention_factor(std::nullopt) == 1.0);
}
