// The step executor on a real model: the single-stage schedule gives autograd's gradients, the
// split backward (B now, W later) gives the same ones bit for bit, the gradient hooks learn which
// backward is the chunk's last, and backward works from an output whose data was released.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "engine/executor.h"
#include "model_test_util.h"

using namespace trainer;
using K = parallel::Action::Kind;

namespace {

model::Transformer tiny_model() {
  model::ModelOptions options;
  options.config = model_test::tiny_config();
  options.seed = 3;
  return model::Transformer(options);
}

std::vector<at::Tensor> gradients(const model::Transformer& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters().all()) out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return out;
}

// Runs `actions` over two micro-batches of a fresh model; returns its gradients.
std::vector<at::Tensor> run(const std::vector<parallel::Action>& actions, std::vector<std::pair<int64_t, bool>>* calls,
                            bool check_deferred = false) {
  model::Transformer m = tiny_model();
  const at::Tensor tokens = model_test::random_tokens(2, 9, 32, 5);
  auto forward = [&](int64_t micro, int64_t, const at::Tensor&) {
    const at::Tensor in = tokens.narrow(0, micro, 1);
    return m.forward(in.narrow(1, 0, 8), in.narrow(1, 1, 8)).loss_sum / 16.0;
  };
  engine::StepExecutor::GradientHooks hooks;
  hooks.begin_backward = [&](int64_t chunk, bool last) {
    if (calls) calls->push_back({chunk, last});
  };
  engine::StepExecutor executor(forward, hooks, &m.parameters().weight_grads());
  executor.run(actions);
  if (check_deferred) {
    // Nothing may be left in the queue after the W actions.
    CHECK(m.parameters().weight_grads().pending() == 0);
  }
  return gradients(m);
}

}  // namespace

TEST_CASE("the executor's single-stage step equals plain autograd - split backward equals it bit for bit", "[parallel][executor]") {
  std::vector<std::pair<int64_t, bool>> calls;
  const auto plain = run(parallel::single_stage_schedule(2), &calls);
  CHECK(calls == std::vector<std::pair<int64_t, bool>>{{0, false}, {0, true}});

  // Reference: autograd's backward on the summed loss.
  model::Transformer m = tiny_model();
  const at::Tensor tokens = model_test::random_tokens(2, 9, 32, 5);
  for (int64_t micro : {0, 1}) {
    const at::Tensor in = tokens.narrow(0, micro, 1);
    (m.forward(in.narrow(1, 0, 8), in.narrow(1, 1, 8)).loss_sum / 16.0).backward();
  }
  const auto reference = gradients(m);
  REQUIRE(plain.size() == reference.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(at::equal(plain[i], reference[i]));

  calls.clear();
  const auto split = run({{K::Forward, 0, 0}, {K::BackwardInput, 0, 0}, {K::Forward, 1, 0}, {K::BackwardInput, 1, 0},
                          {K::BackwardWeight, 0, 0}, {K::BackwardWeight, 1, 0}},
                         &calls, true);
  CHECK(calls == std::vector<std::pair<int64_t, bool>>{{0, false}, {0, true}});
  for (size_t i = 0; i < plain.size(); ++i) CHECK(at::equal(plain[i], split[i]));
}

TEST_CASE("weight gradients wait for W while input gradients and norm gradients come with B", "[parallel][executor]") {
  model::Transformer m = tiny_model();
  const at::Tensor tokens = model_test::random_tokens(1, 9, 32, 5);
  auto forward = [&](int64_t, int64_t, const at::Tensor&) { return m.forward(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)).loss_sum; };
  engine::StepExecutor executor(forward, {}, &m.parameters().weight_grads());
  executor.run({{K::Forward, 0, 0}, {K::BackwardInput, 0, 0}, {K::BackwardWeight, 0, 0}});
  for (const auto& p : m.parameters().all()) CHECK(p.grad().defined());
  // Stop before W: run B only through the lower-level pieces.
  model::Transformer n = tiny_model();
  n.parameters().weight_grads().set_deferring(true);
  engine::backward_from(n.forward(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)).loss_sum, at::ones({}));
  n.parameters().weight_grads().set_deferring(false);
  for (const auto& p : n.parameters().all()) {
    CAPTURE(p.name);
    const bool norm = p.name.find("norm") != std::string::npos;
    CHECK(p.grad().defined() == norm);
  }
  CHECK(n.parameters().weight_grads().pending() > 0);
}

TEST_CASE("backward starts from an output whose data was released after forward", "[parallel][executor]") {
  const at::Tensor w = model_test::randn({4, 4}, 1, at::kFloat).requires_grad_(true);
  const at::Tensor x = model_test::randn({3, 4}, 2, at::kFloat);
  const at::Tensor go = model_test::randn({3, 4}, 3, at::kFloat);
  at::tanh(at::mm(x, w)).backward(go);
  const at::Tensor reference = w.grad().clone();
  w.mutable_grad().reset();

  at::Tensor y = at::tanh(at::mm(x, w));
  y.set_data(at::empty({0}, y.options()));  // as a pipeline stage does once the output is sent
  engine::backward_from(y, go);
  CHECK(at::equal(w.grad(), reference));
}
