// The custom linear and embedding (model/linear_function.h): the same numbers as ATen's ops (bit
// for bit in fp32), weight gradients deferred to a queue (zero-bubble W), weights taken from a
// gather and released (ZeRO-3), fp32 accumulation for bf16 weights, and the parameter's ready
// notification once per contribution.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "model/layers.h"
#include "model/linear_function.h"
#include "model/parallel_linear.h"
#include "model_test_util.h"

using namespace trainer;

namespace {

struct LinearCase {
  model::ParameterSet params{model::ParameterOptions{3, 0.2, at::kFloat}};
  model::Parameter* w = nullptr;
  at::Tensor x;
  LinearCase() {
    w = &params.create("l.weight", {5, 7}, model::InitKind::Normal);
    x = model_test::randn({2, 3, 7}, 4, at::kFloat).requires_grad_(true);
  }
};

}  // namespace

TEST_CASE("the custom linear matches at::linear bit for bit in fp32 - values and both gradients", "[model][linear]") {
  LinearCase c;
  const at::Tensor go = model_test::randn({2, 3, 5}, 9, at::kFloat);
  const at::Tensor y = model::linear(c.x, *c.w, nullptr);
  y.backward(go);
  const at::Tensor gx = c.x.grad().clone(), gw = c.w->tensor.grad().clone();

  const at::Tensor x2 = c.x.detach().clone().requires_grad_(true);
  const at::Tensor w2 = c.w->tensor.detach().clone().requires_grad_(true);
  const at::Tensor y2 = at::linear(x2, w2);
  y2.backward(go);
  CHECK(at::equal(y, y2));
  CHECK(at::equal(gx, x2.grad()));
  CHECK(at::equal(gw, w2.grad()));
  // A second backward accumulates, as autograd does.
  model::linear(c.x, *c.w, nullptr).backward(go);
  CHECK(at::equal(c.w->tensor.grad(), gw + gw));
}

TEST_CASE("a deferring queue holds the weight gradient until it runs - the input gradient comes at once", "[model][linear]") {
  LinearCase c;
  model::WeightGradQueue queue;
  queue.set_deferring(true);
  const at::Tensor go = model_test::randn({2, 3, 5}, 9, at::kFloat);
  model::linear(c.x, *c.w, &queue).backward(go);
  queue.set_deferring(false);
  CHECK(c.x.grad().defined());
  CHECK_FALSE(c.w->tensor.grad().defined());
  CHECK(queue.pending() == 1);
  queue.run_all();
  CHECK(queue.pending() == 0);
  const at::Tensor reference = go.reshape({-1, 5}).t().mm(c.x.detach().reshape({-1, 7}));
  CHECK(at::equal(c.w->tensor.grad(), reference));
}

TEST_CASE("a gathered weight is fetched for forward and again for backward and released after each", "[model][linear]") {
  LinearCase c;
  const at::Tensor full = c.w->tensor.detach().clone();
  // The parameter holds a stand-in (as a ZeRO-3 shard would); the layer must use the gathered weight.
  c.w->tensor.detach().zero_();
  int gathers = 0, releases = 0;
  c.w->gather = [&] {
    ++gathers;
    return full;
  };
  c.w->release = [&] { ++releases; };
  const at::Tensor go = model_test::randn({2, 3, 5}, 9, at::kFloat);
  const at::Tensor y = model::linear(c.x, *c.w, nullptr);
  CHECK(gathers == 1);
  CHECK(releases == 1);
  y.backward(go);
  CHECK(gathers == 2);
  CHECK(releases == 2);
  CHECK(at::equal(y, at::linear(c.x.detach(), full)));
  CHECK(at::equal(c.x.grad(), go.reshape({-1, 5}).mm(full).view({2, 3, 7})));
}

TEST_CASE("bf16 weight gradients accumulate in an fp32 main_grad with one ready call per contribution", "[model][linear]") {
  model::ParameterSet params(model::ParameterOptions{3, 0.2, at::kBFloat16});
  model::Parameter& w = params.create("l.weight", {5, 7}, model::InitKind::Normal);
  w.main_grad = at::zeros({5, 7}, at::kFloat);
  int ready = 0;
  w.grad_ready = [&] { ++ready; };
  at::Tensor expected = at::zeros({5, 7}, at::kFloat);
  for (uint64_t m = 0; m < 3; ++m) {
    const at::Tensor x = model_test::randn({4, 7}, 10 + m, at::kBFloat16).requires_grad_(true);
    const at::Tensor go = model_test::randn({4, 5}, 20 + m, at::kBFloat16);
    model::linear(x, w, nullptr).backward(go);
    expected += go.t().mm(x.detach()).to(at::kFloat);
  }
  CHECK(ready == 3);
  CHECK_FALSE(w.tensor.grad().defined());
  CHECK(w.main_grad.scalar_type() == at::kFloat);
  CHECK(at::equal(w.main_grad, expected));
}

TEST_CASE("the custom embedding matches at::embedding - its gradient goes to the parameter", "[model][linear]") {
  model::ParameterSet params(model::ParameterOptions{3, 0.2, at::kFloat});
  model::Parameter& w = params.create("e.weight", {11, 4}, model::InitKind::Normal);
  const at::Tensor tokens = model_test::random_tokens(3, 5, 11, 2);
  const at::Tensor go = model_test::randn({3, 5, 4}, 6, at::kFloat);
  const at::Tensor y = model::embedding(tokens, w, nullptr);
  // The output requires grad through the parameter, although tokens do not.
  REQUIRE(y.requires_grad());
  y.backward(go);
  const at::Tensor w2 = w.tensor.detach().clone().requires_grad_(true);
  const at::Tensor y2 = at::embedding(w2, tokens);
  y2.backward(go);
  CHECK(at::equal(y, y2));
  CHECK(at::equal(w.tensor.grad(), w2.grad()));
}

TEST_CASE("a tensor-parallel layer without its group refuses to run instead of computing a wrong result", "[model][linear]") {
  model::ParameterSet params(model::ParameterOptions{3, 0.2, at::kFloat});
  model::Linear column(params, "c.weight", 4, 6, model::LinearKind::Column, model::TensorParallel{0, 2});
  CHECK_THROWS_WITH(column.forward(at::ones({2, 4})), Catch::Contains("cannot run without its tp group"));
  // A replicated layer is correct at any tp size.
  model::Linear replicated(params, "r.weight", 4, 6, model::LinearKind::Replicated, model::TensorParallel{1, 2});
  CHECK(replicated.forward(at::ones({2, 4})).sizes().vec() == std::vector<int64_t>{2, 6});
}

TEST_CASE("a linear over a recomputed input equals the linear over the function's output - bit for bit in fp32",
          "[model][linear][recompute]") {
  // f stands for the attention core: its output is the linear's input and is kept by nobody; f runs
  // once in forward and once more in backward (for the weight gradient and its own backward).
  for (bool deferred : {false, true}) {
    CAPTURE(deferred);
    LinearCase c;
    const at::Tensor a = model_test::randn({2, 3, 7}, 5, at::kFloat).requires_grad_(true);
    const at::Tensor constant = model_test::randn({2, 3, 7}, 6, at::kFloat);  // an input without gradient
    int calls = 0;
    const model::TensorFunction f = [&calls](const std::vector<at::Tensor>& in) {
      ++calls;
      return std::vector<at::Tensor>{at::tanh(in[0] * in[1]) + in[2]};
    };
    const at::Tensor go = model_test::randn({2, 3, 5}, 9, at::kFloat);
    model::WeightGradQueue queue;
    queue.set_deferring(deferred);
    const at::Tensor y = model::recomputed_linear(f, {c.x, a, constant}, *c.w, &queue, model::TpComm{});
    CHECK(calls == 1);
    y.backward(go);
    CHECK(calls == 2);
    CHECK(c.w->tensor.grad().defined() != deferred);
    queue.set_deferring(false);
    queue.run_all();
    const at::Tensor gx = c.x.grad().clone(), ga = a.grad().clone(), gw = c.w->tensor.grad().clone();

    const at::Tensor x2 = c.x.detach().clone().requires_grad_(true), a2 = a.detach().clone().requires_grad_(true);
    const at::Tensor w2 = c.w->tensor.detach().clone().requires_grad_(true);
    const at::Tensor y2 = at::linear(f({x2, a2, constant})[0], w2);
    y2.backward(go);
    CHECK(at::equal(y, y2));
    CHECK(at::equal(gx, x2.grad()));
    CHECK(at::equal(ga, a2.grad()));
    CHECK(at::equal(gw, w2.grad()));
  }
}
