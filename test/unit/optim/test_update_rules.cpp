#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>

#include "optim/adamw8bit_rule.h"
#include "optim/dynamic_code.h"
#include "optim/local_optimizer.h"
#include "optim/update_rule.h"

using namespace trainer;

namespace {
model::Parameter make_param(std::string name, at::Tensor tensor, bool weight_decay) {
  model::Parameter p;
  p.name = std::move(name);
  p.global_shape = tensor.sizes().vec();
  p.tensor = std::move(tensor);
  p.weight_decay = weight_decay;
  return p;
}

// The parameters' per-element tensors of a rule run over `cuts`: each parameter of `shapes` is cut
// into pieces at the given flat indices and updated `steps` times with the same gradients; block
// maxima shared by pieces take their maximum over them (what the distributed optimizer's
// reduction does across ranks). Returns weights and the dequantised moments.
struct Outcome {
  std::vector<at::Tensor> weights, moments;
};
Outcome run_cut(const std::vector<std::vector<int64_t>>& shapes, const std::vector<std::vector<int64_t>>& cuts,
                const recipe::OptimizerConfig& config, int steps,
                int64_t run_elements = optim::AdamW8bitRule::kRunElements) {
  optim::AdamW8bitRule rule(config);
  rule.set_run_elements(run_elements);
  std::vector<at::Tensor> weights;
  std::vector<std::vector<optim::PieceGeometry>> geometry(shapes.size());
  std::vector<std::vector<std::vector<at::Tensor>>> states(shapes.size());
  std::vector<std::vector<at::Tensor>> step_counts(shapes.size());
  for (size_t k = 0; k < shapes.size(); ++k) {
    at::manual_seed(int64_t(100 + k));
    weights.push_back(at::randn(shapes[k]).reshape({-1}));
    std::vector<int64_t> bounds = {0};
    for (int64_t c : cuts[k]) bounds.push_back(c);
    bounds.push_back(weights[k].numel());
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      optim::PieceGeometry g;
      g.parameter = "p" + std::to_string(k);
      g.offset = bounds[i];
      g.length = bounds[i + 1] - bounds[i];
      g.row_length = shapes[k].back();
      g.dims = int64_t(shapes[k].size());
      g.global_numel = weights[k].numel();
      g.decay = shapes[k].size() > 1;
      geometry[k].push_back(g);
    }
  }
  for (size_t k = 0; k < shapes.size(); ++k)
    for (const auto& g : geometry[k]) {
      states[k].push_back(rule.make_state(g, at::TensorOptions().dtype(at::kFloat)));
      step_counts[k].push_back(at::zeros({}, at::kFloat));
    }
  for (int s = 0; s < steps; ++s) {
    std::vector<optim::Piece> pieces;
    std::vector<std::pair<size_t, size_t>> owner;
    for (size_t k = 0; k < shapes.size(); ++k) {
      at::manual_seed(int64_t(1000 * s + k));
      const at::Tensor grad = at::randn({weights[k].numel()}).mul_(std::pow(10.0, double(k) - 2));
      for (size_t i = 0; i < geometry[k].size(); ++i) {
        const auto& g = geometry[k][i];
        pieces.push_back({weights[k].narrow(0, g.offset, g.length), grad.narrow(0, g.offset, g.length),
                          step_counts[k][i], &states[k][i], &geometry[k][i]});
        owner.emplace_back(k, i);
      }
    }
    const auto reduce = [&](std::vector<at::Tensor>& maxima) {
      // Blocks by (parameter, block id): the maximum over every piece touching them.
      std::map<std::pair<size_t, int64_t>, std::array<float, 2>> best;
      for (size_t j = 0; j < pieces.size(); ++j) {
        if (!maxima[j].defined()) continue;
        const int64_t first = pieces[j].geometry->grid().first_block(pieces[j].geometry->offset);
        for (int64_t b = 0; b < maxima[j].size(1); ++b)
          for (int r = 0; r < 2; ++r) {
            auto& v = best[{owner[j].first, first + b}][size_t(r)];
            v = std::max(v, maxima[j][r][b].item<float>());
          }
      }
      for (size_t j = 0; j < pieces.size(); ++j) {
        if (!maxima[j].defined()) continue;
        const int64_t first = pieces[j].geometry->grid().first_block(pieces[j].geometry->offset);
        for (int64_t b = 0; b < maxima[j].size(1); ++b)
          for (int r = 0; r < 2; ++r) maxima[j][r][b] = best[{owner[j].first, first + b}][size_t(r)];
      }
    };
    optim::run_update(rule, pieces, 1e-2, 0.1, s + 1, int64_t(1) << 30, {reduce, nullptr});
  }
  Outcome out;
  out.weights = weights;
  // The moments element by element, from the codes and the maxima of each piece.
  const auto signed_code = optim::QuantizationCode::make(true, at::TensorOptions());
  const auto unsigned_code = optim::QuantizationCode::make(false, at::TensorOptions());
  for (size_t k = 0; k < shapes.size(); ++k)
    for (int moment = 0; moment < 2; ++moment) {
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < geometry[k].size(); ++i) {
        const auto& g = geometry[k][i];
        const auto& st = states[k][i];
        if (!rule.quantized(g)) {
          parts.push_back(st[size_t(moment)]);
          continue;
        }
        const optim::BlockGrid grid = g.grid();
        const at::Tensor index = at::arange(g.offset, g.offset + g.length, at::kLong);
        const at::Tensor ids = index.div(grid.row_length, "floor").mul(grid.chunks_per_row)
                                   .add(index.remainder(grid.row_length).div(256, "floor"))
                                   .sub(grid.first_block(g.offset));
        const at::Tensor values = optim::dequantize(moment == 0 ? signed_code : unsigned_code, st[size_t(2 * moment)]);
        parts.push_back(values * st[size_t(2 * moment + 1)].index_select(0, ids));
      }
      out.moments.push_back(at::cat(parts));
    }
  return out;
}
}  // namespace

TEST_CASE("the dynamic code: 256 ascending values - 0 and 1 exact - quantisation picks the nearest", "[optim]") {
  for (const bool is_signed : {true, false}) {
    const at::Tensor values = optim::dynamic_code(is_signed);
    REQUIRE(values.numel() == 256);
    CHECK(at::all(values.narrow(0, 1, 255) > values.narrow(0, 0, 255)).item<bool>());
    CHECK(values[255].item<float>() == 1.0f);
    CHECK(values.min().item<float>() == (is_signed ? Approx(-0.99296875f) : Approx(0.0f)));
    const auto code = optim::QuantizationCode::make(is_signed, at::TensorOptions());
    // The code values themselves come back exactly.
    CHECK(at::equal(optim::quantize(code, values).to(at::kLong), at::arange(256, at::kLong)));
    // Any value lands on a nearest code value.
    at::manual_seed(3);
    at::Tensor x = at::rand({2000}) * (is_signed ? 2 : 1) - (is_signed ? 1 : 0);
    x = at::cat({x, at::rand({500}).mul_(1e-4), at::rand({500}).mul_(1e-6)});
    const at::Tensor back = optim::dequantize(code, optim::quantize(code, x));
    const at::Tensor nearest = std::get<0>((x.unsqueeze(1) - values.unsqueeze(0)).abs().min(1));
    CHECK(at::equal((back - x).abs(), nearest));
  }
}

TEST_CASE("Lion matches its definition over several steps", "[optim]") {
  std::deque<model::Parameter> params;
  params.push_back(make_param("w", at::tensor({0.5, -1.0, 2.0, 0.0}, at::kFloat).requires_grad_(true), true));
  params.push_back(make_param("norm", at::tensor({1.0, 1.0}, at::kFloat).requires_grad_(true), false));
  recipe::OptimizerConfig config;
  config.name = recipe::OptimizerName::Lion;
  config.betas = {0.9, 0.99};
  config.weight_decay = 0.1;
  optim::LocalOptimizer lion(params, config);
  std::vector<double> w = {0.5, -1.0, 2.0, 0.0, 1.0, 1.0}, m(6, 0.0);
  const double lr = 1e-2;
  for (int s = 0; s < 6; ++s) {
    const std::vector<double> g = {0.1 * (s + 1), -0.2, 0.05 * (s % 2 ? -1 : 1), 1.0, 0.3, -0.1 * s};
    params[0].tensor.mutable_grad() = at::tensor(std::vector<double>(g.begin(), g.begin() + 4), at::kDouble).to(at::kFloat);
    params[1].tensor.mutable_grad() = at::tensor(std::vector<double>(g.begin() + 4, g.end()), at::kDouble).to(at::kFloat);
    lion.step(lr);
    for (size_t i = 0; i < 6; ++i) {
      const double c = 0.9 * m[i] + 0.1 * g[i];
      if (i < 4) w[i] *= 1 - lr * 0.1;  // the norm takes no weight decay
      w[i] -= lr * (c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0);
      m[i] = 0.99 * m[i] + 0.01 * g[i];
    }
  }
  for (int i = 0; i < 4; ++i) CHECK(params[0].tensor[i].item<double>() == Approx(w[size_t(i)]).epsilon(1e-6));
  for (int i = 0; i < 2; ++i) CHECK(params[1].tensor[i].item<double>() == Approx(w[size_t(4 + i)]).epsilon(1e-6));
  for (const auto& s : lion.state())
    if (s.name == "optimizer.momentum.w") CHECK(s.tensor[1].item<double>() == Approx(m[1]).epsilon(1e-5));
}

TEST_CASE("AdamW with bf16 moments keeps them in bf16 and follows fp32 AdamW closely", "[optim]") {
  auto run = [](recipe::Precision states) {
    std::deque<model::Parameter> params;
    at::manual_seed(5);
    params.push_back(make_param("w", at::randn({33, 7}).requires_grad_(true), true));
    recipe::OptimizerConfig config;
    config.state_dtype = states;
    optim::LocalOptimizer adam(params, config);
    for (int s = 0; s < 5; ++s) {
      at::manual_seed(50 + s);
      params[0].tensor.mutable_grad() = at::randn({33, 7});
      adam.step(1e-2);
    }
    for (const auto& s : adam.state())
      if (s.name == "optimizer.exp_avg.w")
        CHECK(s.tensor.scalar_type() == (states == recipe::Precision::BF16 ? at::kBFloat16 : at::kFloat));
    return params[0].tensor.detach().clone();
  };
  const at::Tensor bf16 = run(recipe::Precision::BF16), fp32 = run(recipe::Precision::FP32);
  CHECK(!at::equal(bf16, fp32));
  CHECK((bf16 - fp32).abs().max().item<double>() < 2e-3);  // 5 steps of lr 1e-2: moments rounded to 8 bits
}

TEST_CASE("8-bit AdamW: the same update and state however the parameters are cut into pieces", "[optim]") {
  // A matrix with rows of 300 columns (blocks of 256 and 44 per row), one of 40 columns (a block
  // per row), a small matrix and a vector that keep fp32 moments. Cuts inside blocks, at block
  // boundaries, one element from the end, as dp 1 to 4 and ZeRO shards would place them.
  // And rows of 512 (whole flat blocks: the broadcast path between a piece's part blocks).
  const std::vector<std::vector<int64_t>> shapes = {{5, 300}, {23, 40}, {3, 9}, {50}, {4, 512}};
  recipe::OptimizerConfig config;
  config.name = recipe::OptimizerName::AdamW8bit;
  config.min_8bit_size = 100;
  const Outcome whole = run_cut(shapes, {{}, {}, {}, {}, {}}, config, 4);
  const std::vector<std::vector<std::vector<int64_t>>> meshes = {
      {{750}, {460}, {13}, {25}, {1024}},                             // two shards
      {{500, 1000}, {306, 613}, {9, 18}, {17, 34}, {683, 1366}},      // three
      {{1, 256, 257, 1499}, {40, 41, 919}, {26}, {1}, {255, 1793}},  // boundaries at and next to block edges
      {{100, 600, 1200}, {5, 230, 700}, {7, 8, 20}, {10, 30, 49}, {300, 512, 1000, 2047}}};
  for (const auto& cuts : meshes)
    for (const int64_t run : {optim::AdamW8bitRule::kRunElements, int64_t(100)}) {  // runs of 100: cut at blocks
      const Outcome cut = run_cut(shapes, cuts, config, 4, run);
      for (size_t k = 0; k < shapes.size(); ++k) CHECK(at::equal(whole.weights[k], cut.weights[k]));
      for (size_t j = 0; j < whole.moments.size(); ++j) CHECK(at::equal(whole.moments[j], cut.moments[j]));
    }
  // And the state is really 8-bit where it should be: codes are bytes, maxima one per block.
  optim::AdamW8bitRule rule(config);
  optim::PieceGeometry g;
  g.offset = 0;
  g.length = 1500;
  g.row_length = 300;
  g.dims = 2;
  g.global_numel = 1500;
  const auto state = rule.make_state(g, at::TensorOptions().dtype(at::kFloat));
  REQUIRE(state.size() == 4);
  CHECK(state[0].scalar_type() == at::kByte);
  CHECK(state[1].numel() == 10);
  g.row_length = 1;
  g.dims = 1;
  CHECK(rule.state_specs(g).front().name == "exp_avg");
}
