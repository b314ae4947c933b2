// Document masking (data.document_masking): a window holding several documents, with positions
// restarting at each, equals each document run alone from position 0, in fp64: the loss and
// every gradient. Covered: a length-1 document starting a window, documents of one token in the
// middle, a document spanning the whole window, a sliding window over documents, latent attention.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "model/token_context.h"
#include "model/transformer.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;

namespace {

model::Transformer build(const recipe::ModelConfig& config) {
  model::ModelOptions options;
  options.config = config;
  options.seed = 5;
  options.dtype = at::kDouble;
  return model::Transformer(options);
}

}  // namespace

TEST_CASE("document masking equals each document run alone - loss and every gradient in fp64 - positions restarting",
          "[model][documents]") {
  struct Variant {
    const char* name;
    recipe::ModelConfig config;
  };
  recipe::ModelConfig windowed = model_test::tiny_config(false);
  windowed.sliding_window = 3;
  windowed.sliding_window_layers = {1};
  recipe::ModelConfig latent = model_test::tiny_config(false);
  latent.num_key_value_heads = latent.num_attention_heads;
  latent.mla = recipe::MlaConfig{8, 6, 4, 2, 4, true};
  const std::vector<Variant> variants = {{"grouped-query", model_test::tiny_config(true)},
                                         {"sliding window 3 in layer 1", windowed},
                                         {"latent attention", latent}};
  // Document lengths of each sample's 11 positions.
  const std::vector<std::vector<int64_t>> lengths = {{1, 4, 1, 5}, {11}, {3, 1, 1, 6}};
  const int64_t b = int64_t(lengths.size()), t = 11;
  for (const auto& variant : variants) {
    INFO(variant.name);
    const recipe::ModelConfig& config = variant.config;
    const model::Transformer joint = build(config), alone = build(config);
    const at::Tensor inputs = model_test::random_tokens(b, t, config.vocab_size, 7);
    at::Tensor targets = model_test::random_tokens(b, t, config.vocab_size, 8);
    model::TokenContext context;
    context.documents = at::zeros({b, t}, at::kLong);
    context.positions = at::zeros({b, t}, at::kLong);
    for (int64_t s = 0; s < b; ++s) {
      int64_t begin = 0;
      for (size_t d = 0; d < lengths[size_t(s)].size(); ++d) {
        const int64_t n = lengths[size_t(s)][d];
        context.documents[s].narrow(0, begin, n).fill_(int64_t(d));
        context.positions[s].narrow(0, begin, n).copy_(at::arange(n, at::kLong));
        begin += n;
        // The last token of a document does not predict the next document's first.
        if (d + 1 < lengths[size_t(s)].size()) targets[s][begin - 1] = model::kIgnoreIndex;
      }
    }
    model::ForwardOutput together;
    joint.forward_chunk(0, at::Tensor(), inputs, targets, &together, context);
    // The same model weights (same seed), each document alone from position 0.
    at::Tensor separate = at::zeros({}, at::kDouble);
    for (int64_t s = 0; s < b; ++s) {
      int64_t begin = 0;
      for (const int64_t n : lengths[size_t(s)]) {
        const model::ForwardOutput one = alone.forward(inputs.narrow(0, s, 1).narrow(1, begin, n).contiguous(),
                                                       targets.narrow(0, s, 1).narrow(1, begin, n).contiguous());
        separate = separate + one.loss_sum;
        begin += n;
      }
    }
    INFO("together " << together.loss_sum.item<double>() << " alone " << separate.item<double>());
    CHECK(max_relative_error(together.loss_sum.detach(), separate.detach()) < 1e-12);
    // Masking changes the loss: the same tokens as one sequence give another.
    const model::ForwardOutput causal = build(config).forward(inputs, targets);
    CHECK(max_relative_error(causal.loss_sum.detach(), separate.detach()) > 1e-6);

    together.loss_sum.backward();
    separate.backward();
    int64_t compared = 0;
    for (const auto& p : joint.parameters().all()) {
      INFO(p.name);
      const model::Parameter* q = alone.parameters().find(p.name);
      REQUIRE(q != nullptr);
      REQUIRE(p.tensor.grad().defined());
      CHECK(max_relative_error(p.tensor.grad(), q->tensor.grad()) < 1e-10);
      ++compared;
    }
    CHECK(compared > 10);
  }
}
