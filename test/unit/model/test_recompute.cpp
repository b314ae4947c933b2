// Activation recomputation: the custom autograd function against the plain function, and the
// Transformer's recompute modes against none.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <memory>

#include "model/recompute.h"
#include "model/transformer.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;

TEST_CASE("recompute gives the plain function's outputs and gradients (inputs and captured parameters)",
          "[model][recompute]") {
  const at::Tensor w = model_test::randn({3, 4}, 1).requires_grad_(true);  // a captured "parameter"
  auto calls = std::make_shared<int>(0);
  const model::TensorFunction fn = [w, calls](const std::vector<at::Tensor>& in) {
    ++*calls;
    const at::Tensor a = at::tanh(at::matmul(in[0] + in[2], w)) * in[1];
    const at::Tensor b = (in[0] * in[0]).sum(-1);
    return std::vector<at::Tensor>{a, b};
  };
  const at::Tensor x0 = model_test::randn({5, 3}, 2).requires_grad_(true);
  const at::Tensor y = model_test::randn({5, 4}, 3).requires_grad_(true);
  const at::Tensor c = model_test::randn({5, 3}, 4);  // an input without gradient
  const at::Tensor ga = model_test::randn({5, 4}, 5), gb = model_test::randn({5}, 6);

  struct Result {
    std::vector<at::Tensor> outputs, grads;
  };
  auto run = [&](bool use_recompute, bool use_b) {
    for (const at::Tensor& leaf : {w, x0, y}) leaf.mutable_grad() = at::Tensor();
    const at::Tensor x = x0 * 2;  // a non-leaf input: the gradient must flow on to x0
    const auto outputs = use_recompute ? model::recompute(fn, {x, y, c}) : fn({x, y, c});
    at::Tensor loss = (outputs[0] * ga).sum();
    if (use_b) loss = loss + (outputs[1] * gb).sum();
    loss.backward();
    return Result{outputs, {w.grad(), x0.grad(), y.grad()}};
  };
  for (bool use_b : {true, false}) {
    CAPTURE(use_b);
    const Result plain = run(false, use_b);
    *calls = 0;
    const Result checkpointed = run(true, use_b);
    CHECK(*calls == 2);  // forward, then again in backward
    for (size_t i = 0; i < 2; ++i) {
      CHECK(checkpointed.outputs[i].requires_grad());
      CHECK(at::equal(checkpointed.outputs[i].detach(), plain.outputs[i].detach()));
    }
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      REQUIRE(checkpointed.grads[i].defined());
      CHECK(max_relative_error(checkpointed.grads[i], plain.grads[i]) < 1e-14);
    }
  }
  // Gradients accumulate into captured parameters like any backward.
  for (const at::Tensor& leaf : {w, x0, y}) leaf.mutable_grad() = at::Tensor();
  const at::Tensor x = x0 * 2;
  (model::recompute(fn, {x, y, c})[0] * ga).sum().backward();
  const at::Tensor once = w.grad().clone();
  (model::recompute(fn, {x, y, c})[0] * ga).sum().backward();
  CHECK(max_relative_error(w.grad(), 2 * once) < 1e-14);
}

namespace {

struct Run {
  double loss = 0, aux = 0;
  std::vector<at::Tensor> grads;  // in parameter order; undefined where a parameter got none
};

Run train_step(const recipe::ModelConfig& config, model::Recompute mode, c10::ScalarType dtype) {
  model::ModelOptions options;
  options.config = config;
  options.seed = 3;
  options.dtype = dtype;
  options.recompute = mode;
  model::Transformer m(options);
  const at::Tensor inputs = model_test::random_tokens(2, 6, config.vocab_size, 41);
  const at::Tensor targets = model_test::random_tokens(2, 6, config.vocab_size, 42);
  const model::ForwardOutput out = m.forward(inputs, targets);
  (out.loss_sum + 0.01 * out.aux_loss).backward();
  Run r{out.loss_sum.item<double>(), out.aux_loss.item<double>(), {}};
  for (const auto& p : m.parameters().all()) r.grads.push_back(p.tensor.grad());
  return r;
}

}  // namespace

TEST_CASE("recompute modes give the same loss and gradients as none (fp32)", "[model][recompute]") {
  recipe::ModelConfig dense = model_test::tiny_config(false);
  recipe::ModelConfig moe = model_test::tiny_moe_config(1, /*tie=*/true);
  dense.initializer_range = moe.initializer_range = 0.2;  // gradients well away from zero
  for (const auto& config : {dense, moe}) {
    CAPTURE(config.moe.has_value());
    const Run none = train_step(config, model::Recompute::None, at::kFloat);
    if (config.moe) CHECK(none.aux > 0.5);
    for (const auto& g : none.grads)
      if (!config.moe) CHECK(g.defined());  // a dense model: every parameter gets a gradient
    for (model::Recompute mode : {model::Recompute::CoreAttention, model::Recompute::Selective, model::Recompute::Full}) {
      CAPTURE(int(mode));
      const Run other = train_step(config, mode, at::kFloat);
      CHECK(other.loss == Approx(none.loss).epsilon(1e-6));
      CHECK(other.aux == Approx(none.aux).epsilon(1e-6));
      REQUIRE(other.grads.size() == none.grads.size());
      for (size_t i = 0; i < none.grads.size(); ++i) {
        CAPTURE(i);
        REQUIRE(none.grads[i].defined() == other.grads[i].defined());
        if (!none.grads[i].defined()) continue;
        CHECK(max_relative_error(other.grads[i], none.grads[i]) < 1e-6);
      }
    }
  }
}
