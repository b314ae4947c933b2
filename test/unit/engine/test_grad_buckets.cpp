// Gradient buffers on one process: bf16 parameters get fp32 main_grads that accumulate every
// micro-batch's contribution (the linears' directly, the norms' through autograd's hook), the
// parameters' .grad stays empty, every bucket completes in backward, and the norm and scaling act
// on the buffers.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/grad_buckets.h"
#include "mesh/process_groups.h"
#include "model_test_util.h"

using namespace trainer;

namespace {

model::Transformer tiny_model(c10::ScalarType dtype, bool tie = false) {
  model::ModelOptions options;
  options.config = model_test::tiny_moe_config(0, tie);
  options.seed = 3;
  options.dtype = dtype;
  return model::Transformer(options);
}

}  // namespace

TEST_CASE("bf16 parameters accumulate micro-batches in fp32 gradient buffers", "[parallel][buckets]") {
  const auto groups = mesh::single_process_groups();
  const at::Tensor tokens = model_test::random_tokens(3, 9, 32, 5);
  for (const bool tie : {false, true}) {
    CAPTURE(tie);
    model::Transformer m = tiny_model(at::kBFloat16, tie);
    model::Transformer reference = tiny_model(at::kBFloat16, tie);
    engine::BucketOptions options;
    options.bucket_bytes = 2000;  // several buckets
    engine::GradBuckets buckets(m.parameters().all(), *groups, options);
    REQUIRE(buckets.buckets().size() > 2);
    // The experts are reduced over their own group, in their own buckets.
    for (const auto& b : buckets.buckets())
      for (size_t i : b.params)
        CHECK((m.parameters().all()[i].name.find(".experts.") != std::string::npos) == (b.group == mesh::GroupKind::Edp));

    buckets.begin_step();
    std::vector<at::Tensor> expected(m.parameters().all().size());
    for (int64_t micro = 0; micro < 3; ++micro) {
      const at::Tensor in = tokens.narrow(0, micro, 1);
      buckets.begin_backward(0, micro == 2);
      m.forward(in.narrow(1, 0, 8), in.narrow(1, 1, 8)).loss_sum.backward();
      buckets.end_backward(0);
      // The reference: autograd's bf16 gradient of this micro-batch alone, summed in fp32.
      for (auto& p : reference.parameters().all()) p.tensor.mutable_grad().reset();
      reference.forward(in.narrow(1, 0, 8), in.narrow(1, 1, 8)).loss_sum.backward();
      for (size_t i = 0; i < expected.size(); ++i) {
        const at::Tensor g = reference.parameters().all()[i].grad().to(at::kFloat);
        expected[i] = micro == 0 ? g : expected[i] + g;
      }
    }
    buckets.finish();
    // Every bucket whose experts all received tokens completed during backward.
    CHECK(buckets.stats().launched_in_backward >= 1);
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& p = m.parameters().all()[i];
      CAPTURE(p.name);
      CHECK_FALSE(p.tensor.grad().defined());
      CHECK(p.main_grad.scalar_type() == at::kFloat);
      // bf16 products rounded the same way, summed in fp32 in the same order. A tied weight's two
      // contributions are summed in bf16 by autograd but each added in fp32 here, and the LM head
      // adds one piece per loss chunk (model/linear_cross_entropy.h; in fp32 into main_grad, in
      // bf16 without buffers): bf16 rounding apart.
      if (p.uses == 1 && p.name != "lm_head.weight")
        CHECK(at::equal(p.main_grad, expected[i]));
      else
        CHECK((p.main_grad - expected[i]).abs().max().item<double>() <= 1e-2 * expected[i].abs().max().item<double>());
    }
    std::vector<at::Tensor> all;
    for (const auto& p : m.parameters().all()) all.push_back(p.main_grad.reshape({-1}));
    const double norm = at::cat(all).to(at::kDouble).norm().item<double>();
    CHECK(buckets.grad_norm().item<double>() == Approx(norm).epsilon(1e-6));
    buckets.scale(at::full({}, 0.5, at::kDouble));
    CHECK(buckets.grad_norm().item<double>() == Approx(norm / 2).epsilon(1e-6));
    buckets.zero_grad();
    CHECK(buckets.grad_norm().item<double>() == 0.0);
  }
}
