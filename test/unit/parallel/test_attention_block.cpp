// Ring attention's pieces (parallel/context/attention_block.h): queries attended block by block of
// keys and merged by log-sum-exp equal causal attention over the whole sequence, and the blocks'
// backward, given the rows' final output and log-sum-exp, sums to its gradients. On the CPU in
// fp64 (ATen's CPU flash kernel); on a GPU the CUDA flash kernel in bf16 against the CPU in fp32.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "model_test_util.h"
#include "parallel/context/attention_block.h"

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

void compare(const Attended& got, const Attended& want, double tolerance) {
  CHECK(max_relative_error(got.out, want.out) < tolerance);
  CHECK(max_relative_error(got.dq, want.dq) < tolerance);
  CHECK(max_relative_error(got.dk, want.dk) < tolerance);
  CHECK(max_relative_error(got.dv, want.dv) < tolerance);
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
