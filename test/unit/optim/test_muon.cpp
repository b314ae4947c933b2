#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <string>

#include "optim/local_optimizer.h"
#include "optim/muon_rule.h"

using namespace trainer;

namespace {
model::Parameter make_param(std::string name, at::Tensor tensor, bool weight_decay, bool layer_matrix) {
  model::Parameter p;
  p.name = std::move(name);
  p.global_shape = tensor.sizes().vec();
  p.tensor = std::move(tensor);
  p.weight_decay = weight_decay;
  p.layer_matrix = layer_matrix;
  return p;
}

// The Newton-Schulz iteration of muon_rule.h in double.
at::Tensor newton_schulz_double(const at::Tensor& g, int64_t steps) {
  const bool tall = g.size(0) > g.size(1);
  at::Tensor x = (tall ? g.t() : g).to(at::kDouble);
  x = x / (x.norm() + 1e-7);
  for (int64_t k = 0; k < steps; ++k) {
    const at::Tensor a = x.mm(x.t());
    x = 3.4445 * x + (-4.7750 * a + 2.0315 * a.mm(a)).mm(x);
  }
  return tall ? x.t() : x;
}

double relative(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / b.to(at::kDouble).abs().max().item<double>();
}
}  // namespace

TEST_CASE("Newton-Schulz orthogonalises a tall and a wide matrix alike - as the iteration in double", "[optim][muon]") {
  at::manual_seed(3);
  const at::Tensor g = at::randn({37, 23});
  const at::Tensor o = optim::newton_schulz(g, 5);
  REQUIRE(o.sizes() == g.sizes());
  CHECK(o.scalar_type() == at::kFloat);
  // The wide orientation is the one iterated: the transpose's result is this one's transpose, exactly.
  CHECK(at::equal(optim::newton_schulz(g.t().contiguous(), 5), o.t()));
  CHECK(relative(o, newton_schulz_double(g, 5)) < 1e-5);
  // Keller Jordan's quintic: singular values near 1 (roughly 0.7..1.2), the singular vectors of g.
  const auto [u, s, vh] = at::linalg_svd(g.to(at::kDouble), /*full_matrices=*/false);
  const at::Tensor sv = at::linalg_svdvals(o.to(at::kDouble));
  CHECK(sv.min().item<double>() > 0.5);
  CHECK(sv.max().item<double>() < 1.3);
  const at::Tensor polar = u.mm(vh);
  const double cosine = (o.to(at::kDouble) * polar).sum().item<double>() / (o.to(at::kDouble).norm() * polar.norm()).item<double>();
  CHECK(cosine > 0.98);
}

TEST_CASE("Muon matches its definition over several steps - AdamW for what is not a layer matrix", "[optim][muon]") {
  for (const bool nesterov : {true, false}) {
    for (const auto scale : {recipe::MuonScale::MatchAdamwRms, recipe::MuonScale::Spectral}) {
      INFO("nesterov " << nesterov << " scale " << int(scale));
      at::manual_seed(11);
      std::deque<model::Parameter> params, adam_params;
      params.push_back(make_param("w", at::randn({7, 5}).requires_grad_(true), true, true));          // tall
      params.push_back(make_param("v", at::randn({3, 6}).requires_grad_(true), true, true));          // wide
      params.push_back(make_param("embed", at::randn({4, 5}).requires_grad_(true), true, false));     // AdamW
      params.push_back(make_param("norm", at::ones({5}).requires_grad_(true), false, false));         // AdamW, no decay
      for (size_t i = 2; i < 4; ++i)
        adam_params.push_back(make_param(params[i].name, params[i].tensor.detach().clone().requires_grad_(true),
                                         params[i].weight_decay, false));
      recipe::OptimizerConfig config;
      config.name = recipe::OptimizerName::Muon;
      config.weight_decay = 0.1;
      config.muon.nesterov = nesterov;
      config.muon.scale = scale;
      recipe::OptimizerConfig adam_config = config;
      adam_config.name = recipe::OptimizerName::AdamW;
      optim::LocalOptimizer muon(params, config), adam(adam_params, adam_config);
      std::vector<at::Tensor> w = {params[0].tensor.detach().to(at::kDouble), params[1].tensor.detach().to(at::kDouble)};
      std::vector<at::Tensor> m = {at::zeros_like(w[0]), at::zeros_like(w[1])};
      const double lr = 2e-2, mu = 0.95;
      for (int s = 0; s < 4; ++s) {
        for (size_t i = 0; i < params.size(); ++i) {
          at::manual_seed(100 + 10 * s + int(i));
          params[i].tensor.mutable_grad() = at::randn(params[i].tensor.sizes());
          if (i >= 2) adam_params[i - 2].tensor.mutable_grad() = params[i].tensor.grad().clone();
        }
        muon.step(lr);
        adam.step(lr);
        for (size_t i = 0; i < 2; ++i) {
          const at::Tensor g = params[i].tensor.grad().to(at::kDouble);
          m[i] = mu * m[i] + (1 - mu) * g;
          const at::Tensor input = nesterov ? (1 - mu) * g + mu * m[i] : m[i];
          const int64_t rows = w[i].size(0), cols = w[i].size(1);
          const double factor = scale == recipe::MuonScale::Spectral ? std::sqrt(std::max(1.0, double(rows) / double(cols)))
                                                                      : 0.2 * std::sqrt(double(std::max(rows, cols)));
          w[i] = w[i] * (1 - lr * 0.1) - lr * factor * newton_schulz_double(input, 5);
        }
      }
      CHECK(relative(params[0].tensor.detach(), w[0]) < 1e-5);
      CHECK(relative(params[1].tensor.detach(), w[1]) < 1e-5);
      // The rest is AdamW's update, bit for bit.
      CHECK(at::equal(params[2].tensor.detach(), adam_params[0].tensor.detach()));
      CHECK(at::equal(params[3].tensor.detach(), adam_params[1].tensor.detach()));
      int momenta = 0, moments = 0;
      for (const auto& st : muon.state()) {
        if (st.name == "optimizer.momentum.w" || st.name == "optimizer.momentum.v") ++momenta;
        if (st.name == "optimizer.exp_avg.embed" || st.name == "optimizer.exp_avg_sq.norm") ++moments;
        CHECK(st.name != "optimizer.exp_avg.w");
      }
      CHECK(momenta == 2);
      CHECK(moments == 2);
      CHECK(muon.rule().describe().find("Muon") == 0);
    }
  }
}

TEST_CASE("Muon refuses a matrix it holds only a slice of when no one assembles it", "[optim][muon]") {
  std::deque<model::Parameter> params;
  params.push_back(make_param("w", at::randn({3, 4}).requires_grad_(true), true, true));
  params.back().global_shape = {6, 4};  // the other half on another tp rank
  recipe::OptimizerConfig config;
  config.name = recipe::OptimizerName::Muon;
  optim::LocalOptimizer muon(params, config);
  params[0].tensor.mutable_grad() = at::ones({3, 4});
  CHECK_THROWS_WITH(muon.step(1e-2), Catch::Contains("w is not whole here"));
}
