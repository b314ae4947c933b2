// The chunked LM head + cross-entropy (model/linear_cross_entropy.h) against at::linear and
// at::cross_entropy with autograd in fp64: the loss sum and the gradients of the input and the
// weight, for chunks of 1, 3, 7 rows, a last partial chunk, one chunk for everything, ignored
// labels, a padded vocabulary, deferred weight gradients and gradient buffers (main_grad);
// backward goes over vocabulary slices (two here, the last partial; seven in the bf16 case, which
// sums its pieces into an fp32 main_grad and an fp32 input-gradient sum).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "model/linear_cross_entropy.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;

namespace {

struct Reference {
  at::Tensor loss, grad_h, grad_w;
};

// Rows [vocab_end, V_local) of the weight are padding: out of the softmax.
Reference reference(const at::Tensor& h, const at::Tensor& w, const at::Tensor& targets, int64_t vocab_end,
                    double upstream) {
  const at::Tensor hr = h.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
  const at::Tensor logits = at::linear(hr, wr).narrow(1, 0, vocab_end);
  const at::Tensor loss = at::cross_entropy_loss(logits, targets, {}, at::Reduction::Sum, -100);
  (loss * upstream).backward();
  return {loss.detach(), hr.grad(), wr.grad()};
}

}  // namespace

TEST_CASE("chunked linear cross-entropy equals linear + cross_entropy in value and gradients", "[model][loss]") {
  const int64_t n = 17, hidden = 6, local = 11;
  for (const int64_t vocab_end : {local, int64_t(9)})  // whole, or 2 padding rows
    for (const int64_t chunk : {int64_t(1), int64_t(3), int64_t(7), n, n + 5}) {
      INFO("vocab " << vocab_end << " chunk " << chunk);
      model::ParameterSet params(model::ParameterOptions{4, 0.5, at::kDouble});
      model::Parameter& w = params.create("lm_head.weight", {local, hidden}, model::InitKind::Normal);
      at::manual_seed(3);
      const at::Tensor h = at::randn({n, hidden}, at::kDouble);
      at::Tensor targets = at::randint(0, vocab_end, {n}, at::kLong);
      targets[2] = -100;  // ignored
      targets[11] = -100;
      const Reference ref = reference(h, w.tensor, targets, vocab_end, 0.75);

      const at::Tensor x = h.clone().requires_grad_(true);
      const at::Tensor loss = model::linear_cross_entropy_sum(x, w, &params.weight_grads(), targets, 0, vocab_end, -100,
                                                              nullptr, chunk);
      CHECK(loss.dim() == 0);
      CHECK(loss.scalar_type() == at::kDouble);
      CHECK(max_relative_error(loss, ref.loss) < 1e-13);
      (loss * 0.75).backward();
      CHECK(max_relative_error(x.grad(), ref.grad_h) < 1e-12);
      REQUIRE(w.tensor.grad().defined());
      CHECK(max_relative_error(w.tensor.grad(), ref.grad_w) < 1e-12);
      if (vocab_end < local) CHECK(w.tensor.grad().narrow(0, vocab_end, local - vocab_end).abs().max().item<double>() == 0);
    }
}

TEST_CASE("chunked linear cross-entropy defers its weight gradient and adds it into main_grad once", "[model][loss]") {
  const int64_t n = 10, hidden = 4, vocab = 7;
  model::ParameterSet params(model::ParameterOptions{4, 0.5, at::kDouble});
  model::Parameter& w = params.create("lm_head.weight", {vocab, hidden}, model::InitKind::Normal);
  at::manual_seed(5);
  const at::Tensor h = at::randn({n, hidden}, at::kDouble);
  const at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  const Reference ref = reference(h, w.tensor, targets, vocab, 1.0);
  // Gradient buffers as engine::GradBuckets installs them: main_grad and a readiness callback.
  w.main_grad = at::zeros_like(w.tensor);
  int ready = 0;
  w.grad_ready = [&] { ++ready; };
  params.weight_grads().set_deferring(true);
  const at::Tensor x = h.clone().requires_grad_(true);
  model::linear_cross_entropy_sum(x, w, &params.weight_grads(), targets, 0, vocab, -100, nullptr, 3).backward();
  CHECK(max_relative_error(x.grad(), ref.grad_h) < 1e-12);
  CHECK(ready == 0);  // the weight's pass waits for the queue
  CHECK(params.weight_grads().pending() == 1);
  params.weight_grads().run_all();
  CHECK(ready == 1);  // one contribution, however many chunks
  CHECK(max_relative_error(w.main_grad, ref.grad_w) < 1e-12);
  CHECK(!w.tensor.grad().defined());
}

TEST_CASE("chunked linear cross-entropy in bf16 with an fp32 main_grad over seven vocabulary slices", "[model][loss]") {
  const int64_t n = 33, hidden = 8, vocab = 53;  // ceil(53 / 8) = 7 slices of 8, the last of 5
  REQUIRE(counting::loss_vocab_slice(vocab, hidden) == 8);
  model::ParameterSet params(model::ParameterOptions{4, 0.5, at::kBFloat16});
  model::Parameter& w = params.create("lm_head.weight", {vocab, hidden}, model::InitKind::Normal);
  w.main_grad = at::zeros(w.tensor.sizes(), at::kFloat);
  w.main_grad.fill_(0.25);  // an earlier micro-batch's gradient, kept and added to
  at::manual_seed(7);
  const at::Tensor h = at::randn({n, hidden}).to(at::kBFloat16);
  at::Tensor targets = at::randint(0, vocab, {n}, at::kLong);
  targets[4] = -100;
  // The reference sees the same bf16 values, computed in fp64.
  const Reference ref = reference(h.to(at::kDouble), w.tensor.to(at::kDouble), targets, vocab, 1.0);
  const at::Tensor x = h.clone().requires_grad_(true);
  const at::Tensor loss = model::linear_cross_entropy_sum(x, w, nullptr, targets, 0, vocab, -100, nullptr, 5);
  CHECK(loss.scalar_type() == at::kFloat);
  CHECK(max_relative_error(loss.to(at::kDouble), ref.loss) < 1e-5);
  loss.backward();
  CHECK(x.grad().scalar_type() == at::kBFloat16);
  // bf16 operands, each slice's piece rounded to bf16 once: errors of bf16's precision.
  CHECK(max_relative_error(x.grad().to(at::kDouble), ref.grad_h) < 2e-2);
  CHECK(max_relative_error((w.main_grad - 0.25).to(at::kDouble), ref.grad_w) < 2e-2);
}

TEST_CASE("loss vocabulary slices hold logits about the size of the forward chunks", "[model][loss]") {
  CHECK(counting::loss_vocab_slice(128256, 2048) == 2048);  // 2036 rounded up: 63 slices, the last of 1280
  CHECK(counting::loss_vocab_slice(128256, 4096) == 4032);  // 4008 rounded up: 32 slices
  CHECK(counting::loss_vocab_slice(8000, 128) == 128);      // 127 rounded up
  CHECK(counting::loss_vocab_slice(100, 50) == 50);         // under 64: as it is
  CHECK(counting::loss_vocab_slice(200, 100) == 128);       // 100 rounded up: slices of 128 and 72
  CHECK(counting::loss_vocab_slice(256, 128) == 128);
  CHECK(counting::loss_vocab_slice(10, 100) == 10);         // a small vocabulary: one slice
  CHECK(counting::loss_vocab_slice(1000, 2) == 2);
}

TEST_CASE("loss chunks hold logits about the size of the input rows", "[model][loss]") {
  CHECK(counting::loss_chunk_rows(16384, 128256, 4096) == 512);  // 32 chunks
  CHECK(counting::loss_chunk_rows(512, 256, 128) == 256);
  CHECK(counting::loss_chunk_rows(5, 10, 100) == 5);             // a small vocabulary: one chunk
  CHECK(counting::loss_chunk_rows(1, 1000, 2) == 1);
}
