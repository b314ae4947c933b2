// The Transformer end to end: shapes and dtypes, tying, causality, and the gradient of the loss
// against central differences in double for every recompute mode.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>

#include "model/transformer.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;
using model_test::param;

namespace {

model::Transformer build(const recipe::ModelConfig& config, c10::ScalarType dtype,
                         model::Recompute recompute = model::Recompute::None, uint64_t seed = 5) {
  model::ModelOptions options;
  options.config = config;
  options.seed = seed;
  options.dtype = dtype;
  options.recompute = recompute;
  return model::Transformer(options);
}

// Sum of token cross-entropies of logits [B, T, V] written out: logsumexp - target logit.
at::Tensor cross_entropy_sum(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)});
  const at::Tensor target_logit = flat.gather(1, targets.reshape({-1, 1})).squeeze(1);
  return (at::logsumexp(flat, {1}) - target_logit).sum();
}

}  // namespace

TEST_CASE("ignored targets are left out of the loss - it equals the cross-entropy of the others", "[model][transformer]") {
  const at::Tensor inputs = model_test::random_tokens(2, 7, 32, 1);
  const at::Tensor targets = model_test::random_tokens(2, 7, 32, 2);
  at::Tensor masked = targets.clone();
  masked.index_put_({0, at::indexing::Slice(0, 3)}, model::kIgnoreIndex);
  masked.index_put_({1, 5}, model::kIgnoreIndex);
  const model::Transformer m = build(model_test::tiny_config(false), at::kFloat);
  const at::Tensor logits = m.logits(inputs).to(at::kFloat).reshape({-1, 32});
  // Reference: log-sum-exp minus the target logit, over the real targets only.
  double expected = 0;
  const at::Tensor flat = masked.reshape({-1});
  for (int64_t i = 0; i < flat.size(0); ++i) {
    const int64_t t = flat[i].item<int64_t>();
    if (t == model::kIgnoreIndex) continue;
    expected += at::logsumexp(logits[i], 0).item<double>() - logits[i][t].item<double>();
  }
  const model::ForwardOutput out = m.forward(inputs, masked);
  CHECK(out.loss_sum.item<double>() == Approx(expected).epsilon(1e-5));
  CHECK(out.loss_sum.item<double>() < m.forward(inputs, targets).loss_sum.item<double>());
}

TEST_CASE("Transformer shapes and dtypes: logits B x T x V in the model dtype and fp32 scalar losses",
          "[model][transformer]") {
  const at::Tensor inputs = model_test::random_tokens(2, 5, 32, 1);
  const at::Tensor targets = model_test::random_tokens(2, 5, 32, 2);
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& config : {model_test::tiny_config(false), model_test::tiny_moe_config(1, true)}) {
      CAPTURE(dtype, config.moe.has_value());
      const model::Transformer m = build(config, dtype);
      const at::Tensor logits = m.logits(inputs);
      CHECK(logits.sizes().vec() == std::vector<int64_t>{2, 5, 32});
      CHECK(logits.scalar_type() == dtype);
      const model::ForwardOutput out = m.forward(inputs, targets);
      CHECK(out.loss_sum.dim() == 0);
      CHECK(out.loss_sum.scalar_type() == at::kFloat);
      CHECK(out.aux_loss.dim() == 0);
      CHECK(out.aux_loss.scalar_type() == at::kFloat);
      CHECK(out.tokens == 10);
      CHECK(std::isfinite(out.loss_sum.item<double>()));
      // Small initial weights: logits near zero, the loss near ln(V) per token.
      CHECK(out.loss_sum.item<double>() == Approx(10 * std::log(32.0)).epsilon(0.05));
      // forward's loss is the cross-entropy of logits().
      CHECK(out.loss_sum.item<double>() ==
            Approx(cross_entropy_sum(logits.to(at::kFloat), targets).item<double>()).epsilon(1e-5));
      if (config.moe)
        CHECK(out.aux_loss.item<double>() > 0.5);  // one MoE layer: a loss near 1
      else
        CHECK(out.aux_loss.item<double>() == 0.0);
    }
  }
}

TEST_CASE("a tied LM head is the embedding", "[model][transformer]") {
  const at::Tensor inputs = model_test::random_tokens(2, 5, 32, 3);
  const model::Transformer tied = build(model_test::tiny_config(true), at::kDouble);
  model::Transformer untied = build(model_test::tiny_config(false), at::kDouble);
  CHECK_FALSE(at::allclose(tied.logits(inputs), untied.logits(inputs)));
  {
    at::NoGradGuard no_grad;
    param(untied.parameters(), "lm_head.weight").copy_(param(untied.parameters(), "model.embed_tokens.weight"));
  }
  CHECK(max_relative_error(untied.logits(inputs), tied.logits(inputs)) < 1e-14);
}

TEST_CASE("logits are causal and independent across the batch", "[model][transformer]") {
  for (const auto& config : {model_test::tiny_config(false), model_test::tiny_moe_config(0)}) {
    CAPTURE(config.moe.has_value());
    const model::Transformer m = build(config, at::kDouble);
    const at::Tensor inputs = model_test::random_tokens(2, 6, 32, 4);
    const at::Tensor base = m.logits(inputs);
    // Change token 4 of sequence 0: positions 0..3 of that sequence and all of sequence 1 keep
    // their logits (dropless MoE routes each token on its own).
    at::Tensor changed = inputs.clone();
    changed[0][4] = (inputs[0][4].item<int64_t>() + 1) % 32;
    const at::Tensor after = m.logits(changed);
    CHECK(max_relative_error(after[0].narrow(0, 0, 4), base[0].narrow(0, 0, 4)) < 1e-12);
    CHECK(max_relative_error(after[1], base[1]) < 1e-12);
    CHECK_FALSE(at::allclose(after[0][4], base[0][4]));
    CHECK_FALSE(at::allclose(after[0][5], base[0][5]));
  }
}

// RmsNorm normalises in fp32 even in a double model (x.to(kFloat), as Hugging Face does), so the
// loss carries fp32 rounding (~1e-7 relative): a fourth-order difference with a step of 1e-2 and a
// tolerance of 1e-3 relative + 5e-4 absolute (measured worst error 1.1e-4 absolute; the gradients
// are O(0.1-1)). With RmsNorm computed in double the same check passes at 1e-5 relative.
TEST_CASE("Transformer loss gradient matches central differences in double for every recompute mode",
          "[model][transformer][gradcheck]") {
  recipe::ModelConfig config = model_test::tiny_config(false);
  config.initializer_range = 0.2;  // gradients well away from zero
  const at::Tensor inputs = model_test::random_tokens(2, 5, 32, 6);
  const at::Tensor targets = model_test::random_tokens(2, 5, 32, 7);
  const std::vector<std::string> names = {
      "model.embed_tokens.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.1.mlp.down_proj.weight",
      "model.norm.weight",
      "lm_head.weight"};
  for (model::Recompute mode : {model::Recompute::None, model::Recompute::Selective, model::Recompute::Full}) {
    CAPTURE(int(mode));
    model::Transformer m = build(config, at::kDouble, mode);
    // A double loss from the double logits (forward's loss_sum is fp32 by contract).
    const auto loss_of = [&] { return cross_entropy_sum(m.logits(inputs), targets).item<double>(); };
    model_test::clear_grads(m.parameters());
    cross_entropy_sum(m.logits(inputs), targets).backward();
    const int64_t token = inputs[0][0].item<int64_t>();
    for (const auto& name : names) {
      const at::Tensor w = param(m.parameters(), name);
      REQUIRE(w.grad().defined());
      // An embedding row that is looked up; otherwise the first, a middle and the last entry.
      const std::vector<int64_t> indices = name == "model.embed_tokens.weight"
                                               ? std::vector<int64_t>{token * 16, token * 16 + 7}
                                               : std::vector<int64_t>{0, w.numel() / 2 + 1, w.numel() - 1};
      for (int64_t index : indices) {
        CAPTURE(name, index);
        const double fd = model_test::central_difference4(w, index, 1e-2, loss_of);
        CHECK(w.grad().view({-1})[index].item<double>() == Approx(fd).epsilon(1e-3).margin(5e-4));
      }
    }
    // forward's fp32 loss_sum has the same gradient to fp32 accuracy.
    std::vector<at::Tensor> grads;
    for (const auto& p : m.parameters().all()) grads.push_back(p.tensor.grad().clone());
    model_test::clear_grads(m.parameters());
    m.forward(inputs, targets).loss_sum.backward();
    for (size_t i = 0; i < grads.size(); ++i)
      CHECK(max_relative_error(m.parameters().all()[i].tensor.grad(), grads[i]) < 1e-5);
  }
}

TEST_CASE("a padded vocabulary changes nothing - same logits and loss and gradients - its rows stay zero",
          "[model][transformer][padding]") {
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    recipe::ModelConfig plain = model_test::tiny_config(tie);  // vocabulary 32, unpadded
    recipe::ModelConfig padded = plain;
    padded.make_vocab_size_divisible_by = 128;  // the default: 32 rows padded to 128 at tp 1
    model::Transformer a = build(plain, at::kDouble), b = build(padded, at::kDouble);
    const model::Parameter& embed = *b.parameters().find("model.embed_tokens.weight");
    CHECK(embed.global_shape == std::vector<int64_t>{32, 16});
    CHECK(embed.tensor.sizes().vec() == std::vector<int64_t>{128, 16});
    CHECK(embed.real_sizes() == std::vector<int64_t>{32, 16});
    const at::Tensor inputs = model_test::random_tokens(2, 7, 32, 3);
    const at::Tensor targets = model_test::random_tokens(2, 7, 32, 4);
    CHECK(b.logits(inputs).sizes().vec() == std::vector<int64_t>{2, 7, 32});
    CHECK(max_relative_error(b.logits(inputs), a.logits(inputs)) < 1e-12);
    const auto la = a.forward(inputs, targets), lb = b.forward(inputs, targets);
    CHECK(max_relative_error(lb.loss_sum, la.loss_sum) < 1e-12);
    la.loss_sum.backward();
    lb.loss_sum.backward();
    for (const auto& p : b.parameters().all()) {
      CAPTURE(p.name);
      const model::Parameter& q = *a.parameters().find(p.name);
      CHECK(at::equal(p.real_part(p.tensor), q.tensor));
      CHECK(max_relative_error(p.real_part(p.grad()), q.grad()) < 1e-12);
      if (p.tensor.size(0) > p.real_sizes()[0]) {
        CHECK(at::equal(p.tensor.narrow(0, 32, 96), at::zeros({96, 16}, p.tensor.options())));
        CHECK(at::equal(p.grad().narrow(0, 32, 96), at::zeros({96, 16}, p.tensor.options())));
      }
    }
  }
}
