// Ring attention's pieces (parallel/context/attention_block.h): queries attended block by block of
// keys and merged by log-sum-exp equal causal attention over the whole sequence, and the blocks'
// backward, given the rows' final output and log-sum-exp, sums to its gradients. On the CPU in
// fp64 (ATen's CPU flash kernel); on a GPU the CUDA flash kernel in bf16 against the CPU in fp32.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "model_test_util.h"
#include "parallel/context/attention_block.h"
#include "parallel/context/causal_sdpa.h"

#include <cmath>
#include <vector>

using namespace trainer;
using model_test::max_relative_error;

namespace {

struct Attended {
  at::Tensor out, dq, dk, dv;
};

// q [B, h, 2c, d] against k, v [B, kv, 2c, d] in two blocks of c keys, as ring attention splits
// its work: the first c queries attend the first key block (causal, a square diagonal block); the
// last c attend the first block whole, merged with the second (causal).
Attended blockwise(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out) {
  const int64_t c = q.size(2) / 2;
  auto first = [c](const at::Tensor& t) { return t.narrow(2, 0, c); };
  auto second = [c](const at::Tensor& t) { return t.narrow(2, c, c); };
  const auto acc = at::promote_types(q.scalar_type(), at::kFloat);
  const parallel::BlockAttention diagonal = parallel::attend_block(first(q), first(k), first(v), true);
  const parallel::BlockAttention earlier = parallel::attend_block(second(q), first(k), first(v), false);
  at::Tensor out2 = earlier.out.to(acc), lse2 = earlier.lse.to(acc);
  parallel::merge_block(out2, lse2, parallel::attend_block(second(q), second(k), second(v), true));
  const at::Tensor out = at::cat({diagonal.out.to(acc), out2}, 2).to(q.scalar_type());
  const at::Tensor lse = at::cat({diagonal.lse.to(acc), lse2}, 2).to(acc);

  const auto g1 = parallel::attend_block_backward(first(grad_out), first(q), first(k), first(v), first(out), first(lse), true);
  const auto g2 =
      parallel::attend_block_backward(second(grad_out), second(q), first(k), first(v), second(out), second(lse), false);
  const auto g3 =
      parallel::attend_block_backward(second(grad_out), second(q), second(k), second(v), second(out), second(lse), true);
  Attended a;
  a.out = out;
  a.dq = at::cat({g1.dq.to(acc), g2.dq.to(acc) + g3.dq.to(acc)}, 2);
  a.dk = at::cat({g1.dk.to(acc) + g2.dk.to(acc), g3.dk.to(acc)}, 2);
  a.dv = at::cat({g1.dv.to(acc) + g2.dv.to(acc), g3.dv.to(acc)}, 2);
  return a;
}

// Causal attention over the whole sequence with autograd, grouped-query heads repeated.
Attended reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out) {
  const at::Tensor qr = q.detach().clone().requires_grad_(true), kr = k.detach().clone().requires_grad_(true),
                   vr = v.detach().clone().requires_grad_(true);
  const int64_t groups = q.size(1) / k.size(1);
  const at::Tensor out = at::scaled_dot_product_attention(qr, kr.repeat_interleave(groups, 1),
                                                          vr.repeat_interleave(groups, 1), {}, 0.0, true);
  out.backward(grad_out);
  return {out.detach(), qr.grad(), kr.grad(), vr.grad()};
}

// Relative to the largest reference value, or to 1 where every value is below it (a window of one
// token: each query attends only its own key, so dq and dk are zero up to rounding).
void compare(const Attended& got, const Attended& want, double tolerance) {
  CHECK(max_relative_error(got.out, want.out, 1.0) < tolerance);
  CHECK(max_relative_error(got.dq, want.dq, 1.0) < tolerance);
  CHECK(max_relative_error(got.dk, want.dk, 1.0) < tolerance);
  CHECK(max_relative_error(got.dv, want.dv, 1.0) < tolerance);
}

}  // namespace

TEST_CASE("ring attention blocks merged by log-sum-exp equal causal attention - values and gradients - fp64",
          "[parallel][cp]") {
  // 6 query heads over 2 key/value heads (grouped), 2 blocks of 5 tokens, head size 8.
  const at::Tensor q = model_test::randn({2, 6, 10, 8}, 1), k = model_test::randn({2, 2, 10, 8}, 2),
                   v = model_test::randn({2, 2, 10, 8}, 3), g = model_test::randn({2, 6, 10, 8}, 4);
  compare(blockwise(q, k, v, g), reference(q, k, v, g), 1e-12);
}

TEST_CASE("on a GPU ring attention's blocks run the CUDA flash kernel and agree with causal attention in bf16",
          "[parallel][cp][cuda]") {
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: ring attention's CUDA blocks not checked");
    return;
  }
  // 8 query heads over 2 key/value heads, 2 blocks of 64 tokens, head size 64; the same bf16
  // values on both sides, the reference in fp32 on the CPU.
  auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  const at::Tensor q = bf16(model_test::randn({2, 8, 128, 64}, 1, at::kFloat)),
                   k = bf16(model_test::randn({2, 2, 128, 64}, 2, at::kFloat)),
                   v = bf16(model_test::randn({2, 2, 128, 64}, 3, at::kFloat)),
                   g = bf16(model_test::randn({2, 8, 128, 64}, 4, at::kFloat));
  const at::Device gpu(at::kCUDA, 0);
  Attended got = blockwise(q.to(gpu), k.to(gpu), v.to(gpu), g.to(gpu));
  for (at::Tensor* t : {&got.out, &got.dq, &got.dk, &got.dv}) *t = t->cpu().to(at::kFloat);
  const Attended want = reference(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), g.to(at::kFloat));
  compare(got, want, 2e-2);
  // fp32 is refused with the reason, not computed by another kernel.
  CHECK_THROWS_WITH(parallel::attend_block(q.to(gpu).to(at::kFloat), k.to(gpu).to(at::kFloat),
                                           v.to(gpu).to(at::kFloat), true),
                    Catch::Contains("bf16 or fp16"));
}

namespace {

// Sliding-window attention written out: query i attends key j when 0 <= i - j < window
// (transformers' rule), softmax in the inputs' dtype with autograd, grouped heads repeated.
Attended window_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                          int64_t window) {
  const at::Tensor qr = q.detach().clone().requires_grad_(true), kr = k.detach().clone().requires_grad_(true),
                   vr = v.detach().clone().requires_grad_(true);
  const int64_t groups = q.size(1) / k.size(1), s = q.size(2);
  const at::Tensor scores =
      at::matmul(qr, kr.repeat_interleave(groups, 1).transpose(-1, -2)) / std::sqrt(double(q.size(3)));
  at::Tensor allowed = at::zeros({s, s}, at::kBool);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j) allowed[i][j] = i - j >= 0 && i - j < window;
  const at::Tensor out =
      at::matmul(at::softmax(scores.masked_fill(allowed.logical_not(), -INFINITY), -1), vr.repeat_interleave(groups, 1));
  out.backward(grad_out);
  return {out.detach(), qr.grad(), kr.grad(), vr.grad()};
}

// The same by bands: each pair (query chunk a, key chunk b) of two chunks of c tokens, skipped when
// outside the window, its leading band_rows query rows merged by log-sum-exp.
Attended windowed_blockwise(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad_out,
                            int64_t window) {
  const int64_t c = q.size(2) / 2;
  const auto acc = at::promote_types(q.scalar_type(), at::kFloat);
  at::Tensor out = at::zeros(q.sizes(), q.options().dtype(acc));
  at::Tensor lse = at::full({q.size(0), q.size(1), q.size(2)}, -INFINITY, out.options());
  struct Pair {
    int64_t a, b, rows;
    parallel::Band band;
  };
  std::vector<Pair> pairs;
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b <= a; ++b) {
      const parallel::Band band{(a - b) * c, window};
      const int64_t rows = parallel::band_rows(band, c, c);
      if (rows > 0) pairs.push_back({a, b, rows, band});
    }
  for (const Pair& p : pairs) {
    at::Tensor o = out.narrow(2, p.a * c, p.rows), l = lse.narrow(2, p.a * c, p.rows);
    parallel::merge_block(o, l, parallel::attend_band(q.narrow(2, p.a * c, p.rows), k.narrow(2, p.b * c, c),
                                                      v.narrow(2, p.b * c, c), p.band));
  }
  Attended result;
  result.out = out.to(q.scalar_type());
  result.dq = at::zeros(q.sizes(), out.options());
  result.dk = at::zeros(k.sizes(), out.options());
  result.dv = at::zeros(v.sizes(), out.options());
  const at::Tensor lse_kernel = lse.to(q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  for (const Pair& p : pairs) {
    const auto rows = [&](const at::Tensor& t) { return t.narrow(2, p.a * c, p.rows); };
    const auto keys = [&](const at::Tensor& t) { return t.narrow(2, p.b * c, c); };
    const auto g = parallel::attend_band_backward(rows(grad_out), rows(q), keys(k), keys(v), rows(result.out),
                                                  rows(lse_kernel), p.band);
    rows(result.dq).add_(g.dq);
    keys(result.dk).add_(g.dk);
    keys(result.dv).add_(g.dv);
  }
  return result;
}

}  // namespace

TEST_CASE("sliding windows: bands of blocks and causal_sdpa equal the written-out window attention - fp64",
          "[parallel][cp]") {
  // 6 query heads over 2 key/value heads, 2 chunks of 5 tokens, head size 8; windows inside one
  // chunk, across the boundary, and one short of the sequence.
  const at::Tensor q = model_test::randn({2, 6, 10, 8}, 1), k = model_test::randn({2, 2, 10, 8}, 2),
                   v = model_test::randn({2, 2, 10, 8}, 3), g = model_test::randn({2, 6, 10, 8}, 4);
  for (const int64_t window : {1, 3, 5, 7, 9}) {
    INFO("window " << window);
    const Attended want = window_reference(q, k, v, g, window);
    compare(windowed_blockwise(q, k, v, g, window), want, 1e-12);
    const at::Tensor qr = q.clone().requires_grad_(true), kr = k.clone().requires_grad_(true),
                     vr = v.clone().requires_grad_(true);
    const at::Tensor out = parallel::causal_sdpa(qr, kr, vr, window);
    out.backward(g);
    compare({out.detach(), qr.grad(), kr.grad(), vr.grad()}, want, 1e-12);
  }
  // Rows and skipping (blocks of 5): keys 5 back with a window of 3 are reached by the first 2 queries
  // only (positions 5 and 6 reach down to 3 and 4); keys 10 back with a window of 5 by none (the
  // pair is skipped), with 7 by the first query (position 10 reaches key 4).
  CHECK(parallel::band_rows({5, 3}, 5, 5) == 2);
  CHECK(parallel::band_rows({10, 5}, 5, 5) == 0);
  CHECK(parallel::band_rows({10, 7}, 5, 5) == 1);
  CHECK(parallel::band_rows({0, 1}, 5, 5) == 5);
  // A window at least as long as the sequence is causal attention itself.
  const at::Tensor qr = q.clone().requires_grad_(true);
  CHECK(at::equal(parallel::causal_sdpa(qr, k, v, 10), parallel::causal_sdpa(qr, k, v)));
}

TEST_CASE("on a GPU sliding-window attention runs the flash kernel's window and agrees with the CPU in bf16",
          "[parallel][cp][cuda]") {
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: the flash kernel's sliding window not checked");
    return;
  }
  auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  const at::Tensor q = bf16(model_test::randn({2, 8, 128, 64}, 1, at::kFloat)),
                   k = bf16(model_test::randn({2, 2, 128, 64}, 2, at::kFloat)),
                   v = bf16(model_test::randn({2, 2, 128, 64}, 3, at::kFloat)),
                   g = bf16(model_test::randn({2, 8, 128, 64}, 4, at::kFloat));
  const at::Device gpu(at::kCUDA, 0);
  for (const int64_t window : {1, 40, 64, 100}) {
    INFO("window " << window);
    const Attended want = window_reference(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), g.to(at::kFloat), window);
    Attended bands = windowed_blockwise(q.to(gpu), k.to(gpu), v.to(gpu), g.to(gpu), window);
    for (at::Tensor* t : {&bands.out, &bands.dq, &bands.dk, &bands.dv}) *t = t->cpu().to(at::kFloat);
    compare(bands, want, 2e-2);
    const at::Tensor qr = q.to(gpu).requires_grad_(true), kr = k.to(gpu).requires_grad_(true),
                     vr = v.to(gpu).requires_grad_(true);
    const at::Tensor out = parallel::causal_sdpa(qr, kr, vr, window);
    out.backward(g.to(gpu));
    compare({out.detach().cpu().to(at::kFloat), qr.grad().cpu().to(at::kFloat), kr.grad().cpu().to(at::kFloat),
             vr.grad().cpu().to(at::kFloat)},
            want, 2e-2);
  }
}
