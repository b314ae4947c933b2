// The building blocks against their formulas, in double.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "model/layers.h"
#include "model/parameter.h"
#include "model/rms_norm.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::param;

namespace {
model::ParameterSet double_params(uint64_t seed = 1) {
  return model::ParameterSet(model::ParameterOptions{seed, 0.5, at::kDouble});
}
}  // namespace

TEST_CASE("Linear is x W^T with W of shape out x in - Embedding is a row lookup", "[model][layers]") {
  model::ParameterSet params = double_params();
  model::Linear linear(params, "l.weight", 3, 2, model::LinearKind::Replicated, {});
  const at::Tensor w = param(params, "l.weight");
  REQUIRE(w.sizes().vec() == std::vector<int64_t>{2, 3});
  const at::Tensor x = model_test::randn({4, 3}, 1);
  const at::Tensor y = linear.forward(x);
  for (int n = 0; n < 4; ++n)
    for (int o = 0; o < 2; ++o) {
      double expected = 0;
      for (int i = 0; i < 3; ++i) expected += x[n][i].item<double>() * w[o][i].item<double>();
      CHECK(y[n][o].item<double>() == Approx(expected).epsilon(1e-14));
    }
  model::Embedding embedding(params, "e.weight", 5, 5, 3, {});
  const at::Tensor tokens = at::tensor({4, 0, 4, 2}, at::kLong).view({2, 2});
  const at::Tensor e = embedding.forward(tokens);
  CHECK(e.sizes().vec() == std::vector<int64_t>{2, 2, 3});
  CHECK(at::equal(e[0][0], embedding.parameter().tensor[4]));
  CHECK(at::equal(e[0][1], embedding.parameter().tensor[0]));
  CHECK(at::equal(e[1][0], embedding.parameter().tensor[4]));
  CHECK(at::equal(e[1][1], embedding.parameter().tensor[2]));
}

TEST_CASE("RmsNorm is w times x / sqrt(mean(x^2) + eps) computed in fp32 and cast back", "[model][layers]") {
  model::ParameterSet params(model::ParameterOptions{1, 0.02, at::kFloat});
  model::RmsNorm norm(params, "n.weight", 4, 1e-6);
  const at::Tensor w = param(params, "n.weight");
  {
    at::NoGradGuard no_grad;
    w.copy_(at::tensor({1.0, 2.0, -1.0, 0.5}, at::kFloat));
  }
  const at::Tensor x = at::tensor({1.0, -2.0, 3.0, 4.0, 0.0, 0.5, 0.0, 0.0}, at::kFloat).view({2, 4});
  const at::Tensor y = norm.forward(x);
  CHECK(y.scalar_type() == at::kFloat);
  // Row 0: mean square (1 + 4 + 9 + 16) / 4 = 7.5; row 1: 0.25 / 4 = 0.0625.
  const double r0 = 1 / std::sqrt(7.5 + 1e-6), r1 = 1 / std::sqrt(0.0625 + 1e-6);
  const std::vector<double> expected = {1 * r0, -4 * r0, -3 * r0, 2 * r0, 0, 1 * r1, 0, 0};
  for (int i = 0; i < 8; ++i) CHECK(y.view({-1})[i].item<double>() == Approx(expected[i]).epsilon(1e-6));
  // bf16 input: the same normalisation, rounded to bf16 before the weight (Hugging Face order).
  model::ParameterSet bf16_params(model::ParameterOptions{1, 0.02, at::kBFloat16});
  model::RmsNorm bf16_norm(bf16_params, "n.weight", 4, 1e-6);
  const at::Tensor yb = bf16_norm.forward(x.to(at::kBFloat16));
  CHECK(yb.scalar_type() == at::kBFloat16);
  CHECK(yb.to(at::kFloat)[0][1].item<double>() == Approx(-2 * r0).epsilon(1e-2));
}

TEST_CASE("SwigluMlp is down(silu(gate x) times up x) with Llama or Mixtral names", "[model][layers]") {
  model::ParameterSet params = double_params();
  model::SwigluMlp mlp(params, "mlp.", 3, 5, {});
  model::SwigluMlp expert(params, "experts.0.", 3, 5, {}, /*mixtral_names=*/true);
  const at::Tensor x = model_test::randn({2, 4, 3}, 3);
  auto silu = [](const at::Tensor& a) { return a / (1 + at::exp(-a)); };
  auto reference = [&](const std::string& gate, const std::string& up, const std::string& down) {
    const at::Tensor g = at::matmul(x, param(params, gate).t());
    const at::Tensor u = at::matmul(x, param(params, up).t());
    return at::matmul(silu(g) * u, param(params, down).t());
  };
  CHECK(model_test::max_relative_error(mlp.forward(x), reference("mlp.gate_proj.weight", "mlp.up_proj.weight",
                                                                 "mlp.down_proj.weight")) < 1e-13);
  CHECK(model_test::max_relative_error(expert.forward(x), reference("experts.0.w1.weight", "experts.0.w3.weight",
                                                                    "experts.0.w2.weight")) < 1e-13);
  CHECK(param(params, "experts.0.w2.weight").sizes().vec() == std::vector<int64_t>{3, 5});
}

TEST_CASE("ATen's fused RMSNorm on CUDA agrees with rms_norm in bf16 - outputs and gradients", "[model][layers][cuda]") {
  // ATen's _fused_rms_norm (and its backward) has CUDA kernels only: the candidate for the GPU fast
  // path. Both against an fp64 reference of the same bf16 values; the weight multiplies in fp32 in
  // ATen's kernel and after rounding to bf16 in ours (Hugging Face's order), so they differ by
  // about a bf16 rounding.
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: ATen's fused RMSNorm not compared");
    return;
  }
  const auto on_gpu = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
  const int64_t rows = 96, width = 256;
  const double eps = 1e-5;
  at::manual_seed(11);
  const at::Tensor x = at::randn({rows, width}, on_gpu);
  const at::Tensor w = (at::randn({width}, on_gpu) * 0.1 + 1).detach();
  const at::Tensor dy = at::randn({rows, width}, on_gpu);
  // fp64 reference on the CPU.
  const at::Tensor xr = x.cpu().to(at::kDouble).requires_grad_(true), wr = w.cpu().to(at::kDouble).requires_grad_(true);
  const at::Tensor yr = wr * (xr * at::rsqrt(xr.pow(2).mean(-1, true) + eps));
  (yr * dy.cpu().to(at::kDouble)).sum().backward();
  // Ours.
  const at::Tensor xo = x.clone().requires_grad_(true), wo = w.clone().requires_grad_(true);
  const at::Tensor yo = model::rms_norm(xo, wo, eps);
  (yo * dy).sum().backward();
  // ATen's.
  const auto [yf, rstd] = at::_fused_rms_norm(x, {width}, w, eps);
  const auto [dxf, dwf] = at::_fused_rms_norm_backward(dy, x, {width}, rstd, w, {true, true});
  CHECK(rstd.scalar_type() == at::kFloat);
  for (const auto& [name, ours, aten, ref] :
       std::vector<std::tuple<std::string, at::Tensor, at::Tensor, at::Tensor>>{
           {"output", yo, yf, yr}, {"input gradient", xo.grad(), dxf, xr.grad()}, {"weight gradient", wo.grad(), dwf, wr.grad()}}) {
    const double e_ours = model_test::max_relative_error(ours.cpu(), ref.detach());
    const double e_aten = model_test::max_relative_error(aten.cpu(), ref.detach());
    INFO(name << ": ours " << e_ours << ", ATen " << e_aten);
    CHECK(e_ours < 2e-2);
    CHECK(e_aten < 2e-2);
    WARN(name << " error vs fp64: ours " << e_ours << ", ATen's fused " << e_aten);
  }
}
