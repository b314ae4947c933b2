// Evaluation against a forward-only reference computed here from the same held-out samples: the
// mean cross-entropy over real targets, with and without a masked token.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>

#include "data/dataset.h"
#include "mesh/process_groups.h"
#include "model/transformer.h"
#include "recipe/mesh_shape.h"
#include "train/evaluation.h"

using namespace trainer;

namespace {

recipe::Recipe tiny_recipe() {
  recipe::Recipe r;
  r.model.vocab_size = 64;
  r.model.hidden_size = 16;
  r.model.intermediate_size = 24;
  r.model.num_hidden_layers = 2;
  r.model.num_attention_heads = 4;
  r.model.num_key_value_heads = 2;
  r.model.head_dim = 4;
  r.training.seq_len = 12;
  r.training.micro_batch_size = 2;
  r.training.global_batch_size = 6;
  r.training.seed = 5;
  r.evaluation.interval = 1;
  r.evaluation.steps = 2;
  return r;
}

// The mean cross-entropy of `model` over global batches 0..steps-1 of synthetic samples from 2^62 on.
double reference_loss(const model::Transformer& model, const recipe::Recipe& r, int64_t* tokens) {
  const auto data = data::open_dataset(r);
  const int64_t t = r.training.seq_len;
  double sum = 0;
  *tokens = 0;
  std::vector<int32_t> sample(size_t(t + 1));
  for (int64_t i = 0; i < r.evaluation.steps * *r.training.global_batch_size; ++i) {
    data->sample((uint64_t(1) << 62) + uint64_t(i), t, sample.data());
    const at::Tensor all = at::from_blob(sample.data(), {1, t + 1}, at::kInt).to(at::kLong);
    const at::Tensor logits = model.logits(all.narrow(1, 0, t)).to(at::kDouble)[0];
    const at::Tensor log_probs = at::log_softmax(logits, -1);
    for (int64_t j = 0; j < t; ++j) {
      const int64_t target = all[0][j + 1].item<int64_t>();
      if (r.data.loss_mask_token && target == *r.data.loss_mask_token) continue;
      sum -= log_probs[j][target].item<double>();
      ++*tokens;
    }
  }
  return sum / double(*tokens);
}

}  // namespace

TEST_CASE("evaluation is the forward-only loss of the held-out samples", "[train][evaluation]") {
  recipe::Recipe r = tiny_recipe();
  model::ModelOptions options;
  options.config = r.model;
  options.seed = 5;
  const model::Transformer model(options);
  const recipe::MeshShape mesh = recipe::mesh_shape(r, 1);
  REQUIRE(mesh.grad_accum_steps == 3);
  const auto groups = mesh::single_process_groups();
  const train::PipelinePlan pipeline = train::plan_pipeline(parallel::layout_pipeline(r, mesh), 0);
  for (const std::optional<int64_t> mask : {std::optional<int64_t>(), std::optional<int64_t>(3)}) {
    CAPTURE(mask.has_value());
    r.data.loss_mask_token = mask;
    const auto held_out = data::open_evaluation_dataset(r);
    const train::EvaluationResult result = train::evaluate(model, *held_out, r, mesh, *groups, pipeline, at::Device(at::kCPU));
    int64_t tokens = 0;
    const double expected = reference_loss(model, r, &tokens);
    CHECK(result.tokens == tokens);
    CHECK(result.loss == Approx(expected).epsilon(1e-6));
    CHECK(result.perplexity == Approx(std::exp(expected)).epsilon(1e-6));
    // No gradient was computed.
    for (const auto& p : model.parameters().all()) CHECK_FALSE(p.grad().defined());
  }
  // Held-out samples are not training samples.
  std::vector<int32_t> a(13), b(13);
  data::open_evaluation_dataset(r)->sample(0, 12, a.data());
  data::open_dataset(r)->sample(0, 12, b.data());
  CHECK(a != b);
}
