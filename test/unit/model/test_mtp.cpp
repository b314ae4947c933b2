// Multi-token prediction (DeepSeek-V3 technical report, section 2.2) against a reference written
// out here from the paper, in fp64: module k takes the previous depth's normed hidden state h (the
// main model's final norm output for k = 1, as Megatron's MTP block and vLLM's DeepSeek MTP) and
// the embedding of token i + k, h' = W_eh [RMSNorm_e(Emb(t_{i+k})); RMSNorm_h(h_i)], runs one
// decoder layer and its own RMSNorm (shared_head.norm), whose output predicts token i + k + 1
// through the shared LM head and feeds depth k + 1; the objective is the main loss plus
// mtp_loss_weight / D times the modules' cross-entropy sums.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <map>

#include "model/decoder_layer.h"
#include "model/rotary.h"
#include "model/transformer.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;

namespace {

model::Transformer build(const recipe::ModelConfig& config) {
  model::ModelOptions options;
  options.config = config;
  options.seed = 11;
  options.dtype = at::kDouble;
  return model::Transformer(options);
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps));
}

}  // namespace

TEST_CASE("multi-token prediction equals the paper's modules written out in fp64 - loss and every gradient - and "
          "leaves the main loss bit for bit",
          "[model][mtp]") {
  recipe::ModelConfig config = model_test::tiny_config(false);
  config.mtp_loss_weight = 0.3;
  config.num_nextn_predict_layers = 0;
  const model::Transformer plain = build(config);
  config.num_nextn_predict_layers = 2;
  const model::Transformer with_mtp = build(config);
  const int64_t b = 2, t = 9, depth = 2;
  const at::Tensor inputs = model_test::random_tokens(b, t, config.vocab_size, 3);
  at::Tensor targets = model_test::random_tokens(b, t, config.vocab_size, 4);
  targets.index_put_({1, 4}, model::kIgnoreIndex);  // a masked target: its module targets are ignored too

  const model::ForwardOutput main_only = plain.forward(inputs, targets);
  const model::ForwardOutput out = with_mtp.forward(inputs, targets);
  // The main loss does not see the modules.
  CHECK(at::equal(out.loss_sum.detach(), main_only.loss_sum.detach()));

  // The reference: the main model's hidden state from `plain` (the same weights: a parameter's
  // initial value depends on the seed, its name and its shape), the modules from the paper.
  const model::ParameterSet& ps = with_mtp.parameters();
  auto value = [&](const std::string& name) { return model_test::param(ps, name).detach().clone().requires_grad_(true); };
  const at::Tensor embedding = model_test::param(plain.parameters(), "model.embed_tokens.weight");
  const at::Tensor head = model_test::param(plain.parameters(), "lm_head.weight");
  const at::Tensor h0 = rms(plain.last_hidden(inputs),  // [t, b, H], the final norm's output
                            model_test::param(plain.parameters(), "model.norm.weight"), config.rms_norm_eps);
  // The whole sequence x_0 .. x_t (the inputs and the last target).
  const at::Tensor sequence = at::cat({inputs, targets.narrow(1, t - 1, 1)}, 1);
  model::ParameterSet blocks(model::ParameterOptions{11, config.initializer_range, at::kDouble,
                                                     c10::Device(c10::DeviceType::CPU), false});
  std::vector<model::DecoderLayer> block;
  std::map<std::string, at::Tensor> module_params;
  for (int64_t k = 1; k <= depth; ++k) {
    block.emplace_back(blocks, config.num_hidden_layers + k - 1, config, model::TensorParallel{},
                       model::ContextParallel{}, model::ExpertParallel{}, 0.0, 0.0);
    const std::string prefix = "model.layers." + std::to_string(config.num_hidden_layers + k - 1) + ".";
    for (const char* name : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"})
      module_params[prefix + name] = value(prefix + name);
  }
  const auto [cos, sin] = model::Rotary(config.rotary_dim(), config.rope_theta, config.rope_scaling)
                              .cos_sin(at::arange(t, at::kLong), at::kDouble);
  at::Tensor h = h0, mtp_sum = at::zeros({}, at::kDouble);
  for (int64_t k = 1; k <= depth; ++k) {
    const std::string prefix = "model.layers." + std::to_string(config.num_hidden_layers + k - 1) + ".";
    // Positions i with token i + k + 1 in the sequence: i < t - k.
    const int64_t valid = t - k;
    const at::Tensor next = at::embedding(embedding, at::cat({sequence.narrow(1, k, valid),
                                                              at::zeros({b, k}, at::kLong)}, 1).t());
    const at::Tensor joined = at::cat({rms(next, module_params[prefix + "enorm.weight"], config.rms_norm_eps),
                                       rms(h, module_params[prefix + "hnorm.weight"], config.rms_norm_eps)},
                                      -1);
    const at::Tensor projected = at::matmul(joined, module_params[prefix + "eh_proj.weight"].t());
    h = rms(block[size_t(k - 1)].forward(projected, model::SequenceContext{cos, sin}, false).first,
            module_params[prefix + "shared_head.norm.weight"], config.rms_norm_eps);
    const at::Tensor logits = at::matmul(h, head.t());  // [t, b, V]
    for (int64_t s = 0; s < b; ++s)
      for (int64_t i = 0; i < valid; ++i) {
        const int64_t target = targets[s][i + k].item<int64_t>();
        if (target == model::kIgnoreIndex) continue;
        mtp_sum = mtp_sum + at::logsumexp(logits[i][s], 0) - logits[i][s][target];
      }
  }
  const at::Tensor reference = main_only.loss_sum + mtp_sum * (config.mtp_loss_weight / double(depth));
  INFO("objective " << out.objective.item<double>() << " reference " << reference.item<double>());
  CHECK(max_relative_error(out.mtp_loss_sum, mtp_sum.detach()) < 1e-12);
  CHECK(max_relative_error(out.objective.detach(), reference.detach()) < 1e-12);
  CHECK(out.mtp_loss_sum.item<double>() > 0);

  out.objective.backward();
  reference.backward();
  int64_t compared = 0;
  for (const auto& p : ps.all()) {
    at::Tensor expected;
    if (module_params.count(p.name))
      expected = module_params[p.name].grad();
    else if (const model::Parameter* q = blocks.find(p.name))
      expected = q->tensor.grad();
    else
      expected = plain.parameters().find(p.name)->tensor.grad();
    INFO(p.name);
    REQUIRE(expected.defined());
    REQUIRE(p.tensor.grad().defined());
    CHECK(max_relative_error(p.tensor.grad(), expected) < 1e-10);
    ++compared;
  }
  // Embedding, 2 layers of 9, final norm, head; 2 modules of 4 tensors and a layer of 9.
  CHECK(compared == 1 + 2 * 9 + 2 + 2 * (4 + 9));
}
