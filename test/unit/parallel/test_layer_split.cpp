// The layers of each model chunk (lib/parallel/pipeline/layer_split.h): balanced with the LM head
// counted, or the recipe's pipeline_layout.
#include <catch2/catch.hpp>

#include <numeric>

#include "parallel/pipeline/layer_split.h"

using trainer::parallel::balanced_layer_split;

TEST_CASE("balanced layer split: even without a head - uneven rests to the earlier chunks - the head counted", "[parallel][pipeline]") {
  CHECK(balanced_layer_split(32, 4, 0.0) == std::vector<int64_t>{8, 8, 8, 8});
  CHECK(balanced_layer_split(7, 3, 0.0) == std::vector<int64_t>{3, 2, 2});
  CHECK(balanced_layer_split(5, 1, 3.0) == std::vector<int64_t>{5});
  // Llama 3 8B over 4 stages: the head is 2.4 layers of work; [8,8,8,8] would cost 10.4 on the last.
  CHECK(balanced_layer_split(32, 4, 2.4) == std::vector<int64_t>{9, 9, 8, 6});
  // A head as heavy as many layers leaves the last chunk none.
  CHECK(balanced_layer_split(6, 3, 10.0) == std::vector<int64_t>{3, 3, 0});
  // As few layers as middle chunks: one each there, none on the ends.
  CHECK(balanced_layer_split(2, 4, 0.0) == std::vector<int64_t>{0, 1, 1, 0});
  CHECK_THROWS(balanced_layer_split(1, 4, 0.0));
  // Every split sums to the layers and never costs more than the even split.
  for (int64_t layers = 1; layers <= 40; ++layers)
    for (int64_t chunks = 1; chunks <= 8 && chunks - 2 <= layers; ++chunks)
      for (double head : {0.0, 0.7, 2.4, 5.0}) {
        const auto split = balanced_layer_split(layers, chunks, head);
        CAPTURE(layers, chunks, head);
        REQUIRE(int64_t(split.size()) == chunks);
        CHECK(std::accumulate(split.begin(), split.end(), int64_t(0)) == layers);
        for (int64_t c = 1; c + 1 < chunks; ++c) CHECK(split[size_t(c)] >= 1);
        if (layers % chunks == 0) {
          double most = 0;
          for (int64_t c = 0; c < chunks; ++c) most = std::max(most, double(split[size_t(c)]) + (c == chunks - 1 ? head : 0));
          CHECK(most <= double(layers / chunks) + head + 1e-9);
        }
      }
}

TEST_CASE("layer split of a recipe: pipeline_layout as given - or balanced with the model's head cost", "[parallel][pipeline]") {
  trainer::recipe::Recipe r;
  r.model.num_hidden_layers = 8;
  r.model.hidden_size = 64;
  r.model.head_dim = 16;
  r.model.num_attention_heads = 4;
  r.model.num_key_value_heads = 4;
  r.model.intermediate_size = 128;
  r.model.vocab_size = 1000;
  // A layer: 4 * 64 * 64 + 3 * 64 * 128 = 40960 weights; the head 64000: 1.5625 layers.
  CHECK(trainer::parallel::head_cost_in_layers(r.model) == Approx(1.5625));
  CHECK(trainer::parallel::layer_split(r, 2) == std::vector<int64_t>{5, 3});
  // Two MTP modules on the last chunk: 3 heads (4.6875), 2 layers and 2 eh_proj of 8192 (0.2 each).
  r.model.num_nextn_predict_layers = 2;
  CHECK(trainer::parallel::head_cost_in_layers(r.model) == Approx(3 * 1.5625 + 2 * 1.2));
  CHECK(trainer::parallel::layer_split(r, 2) == std::vector<int64_t>{8, 0});
  CHECK(trainer::parallel::layer_split(r, 3) == std::vector<int64_t>{4, 4, 0});
  r.model.num_nextn_predict_layers = 0;
  r.parallel.pipeline_layout = {2, 6};
  CHECK(trainer::parallel::layer_split(r, 2) == std::vector<int64_t>{2, 6});
  CHECK_THROWS_AS(trainer::parallel::layer_split(r, 3), std::invalid_argument);
}
