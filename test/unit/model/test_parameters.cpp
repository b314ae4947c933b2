// Parameter names (Hugging Face / Mixtral), counts, and the global-initialisation invariant
// (DESIGN.md section 3, invariant 1): values depend only on (seed, name, global shape).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "estimate/model_counts.h"
#include "model/layers.h"
#include "model/parameter.h"
#include "model/transformer.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::param;

namespace {

using Shape = std::vector<int64_t>;
using NamedShapes = std::vector<std::pair<std::string, Shape>>;

NamedShapes names_and_shapes(const model::ParameterSet& params) {
  NamedShapes result;
  for (const auto& p : params.all()) result.emplace_back(p.name, p.global_shape);
  return result;
}

// The dense layer of tiny_config: H=16, heads*head_dim=24, kv*head_dim=12, I=24.
void append_attention(NamedShapes& out, const std::string& layer) {
  out.push_back({layer + "input_layernorm.weight", {16}});
  out.push_back({layer + "self_attn.q_proj.weight", {24, 16}});
  out.push_back({layer + "self_attn.k_proj.weight", {12, 16}});
  out.push_back({layer + "self_attn.v_proj.weight", {12, 16}});
  out.push_back({layer + "self_attn.o_proj.weight", {16, 24}});
  out.push_back({layer + "post_attention_layernorm.weight", {16}});
}

void append_dense_mlp(NamedShapes& out, const std::string& layer) {
  out.push_back({layer + "mlp.gate_proj.weight", {24, 16}});
  out.push_back({layer + "mlp.up_proj.weight", {24, 16}});
  out.push_back({layer + "mlp.down_proj.weight", {16, 24}});
}

model::Transformer build(const recipe::ModelConfig& config, uint64_t seed = 7,
                         c10::ScalarType dtype = at::kFloat) {
  model::ModelOptions options;
  options.config = config;
  options.seed = seed;
  options.dtype = dtype;
  return model::Transformer(options);
}

}  // namespace

TEST_CASE("dense parameter names and shapes are Hugging Face Llama's", "[model][parameters]") {
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    model::Transformer m = build(model_test::tiny_config(tie));
    NamedShapes expected = {{"model.embed_tokens.weight", {32, 16}}};
    for (const std::string layer : {"model.layers.0.", "model.layers.1."}) {
      append_attention(expected, layer);
      append_dense_mlp(expected, layer);
    }
    expected.push_back({"model.norm.weight", {16}});
    if (!tie) expected.push_back({"lm_head.weight", {32, 16}});
    CHECK(names_and_shapes(m.parameters()) == expected);
    CHECK((m.parameters().find("lm_head.weight") == nullptr) == tie);
    // Local tensors are the whole global tensors on one process, leaves that require grad.
    for (const auto& p : m.parameters().all()) {
      CAPTURE(p.name);
      CHECK(p.tensor.sizes().vec() == p.global_shape);
      CHECK(p.tensor.is_leaf());
      CHECK(p.tensor.requires_grad());
      CHECK(p.tensor.scalar_type() == at::kFloat);
      CHECK(p.offsets() == std::vector<int64_t>(p.global_shape.size(), 0));
      const bool is_norm = p.name.find("norm") != std::string::npos;
      CHECK(p.weight_decay == !is_norm);
    }
  }
}

TEST_CASE("MoE parameter names are Mixtral's: block_sparse_moe.gate and experts.E.w1/w2/w3", "[model][parameters]") {
  model::Transformer m = build(model_test::tiny_moe_config(/*shared=*/1));
  NamedShapes expected = {{"model.embed_tokens.weight", {32, 16}}};
  append_attention(expected, "model.layers.0.");
  append_dense_mlp(expected, "model.layers.0.");
  append_attention(expected, "model.layers.1.");
  const std::string moe = "model.layers.1.block_sparse_moe.";
  expected.push_back({moe + "gate.weight", {4, 16}});
  for (int e = 0; e < 4; ++e) {
    const std::string expert = moe + "experts." + std::to_string(e) + ".";
    expected.push_back({expert + "w1.weight", {8, 16}});
    expected.push_back({expert + "w3.weight", {8, 16}});
    expected.push_back({expert + "w2.weight", {16, 8}});
  }
  expected.push_back({moe + "shared_experts.gate_proj.weight", {8, 16}});
  expected.push_back({moe + "shared_experts.up_proj.weight", {8, 16}});
  expected.push_back({moe + "shared_experts.down_proj.weight", {16, 8}});
  expected.push_back({"model.norm.weight", {16}});
  expected.push_back({"lm_head.weight", {32, 16}});
  CHECK(names_and_shapes(m.parameters()) == expected);
  CHECK(m.parameters().find("model.layers.1.mlp.gate_proj.weight") == nullptr);
}

TEST_CASE("parameter count equals a hand count and estimate::count_model", "[model][parameters]") {
  // Dense layer: norms 2*16 + q 24*16 + k,v 2*12*16 + o 16*24 + MLP 3*16*24 = 32+384+384+384+1152 = 2336.
  // Model: embed 32*16=512 + 2 layers 4672 + norm 16 + lm_head 512 = 5712 (5200 tied).
  CHECK(build(model_test::tiny_config(false)).parameters().local_numel() == 5712);
  CHECK(build(model_test::tiny_config(true)).parameters().local_numel() == 5200);
  // MoE layer 1: norms 32 + attention 1152 + router 4*16=64 + 4 experts * 3*16*8=1536 + shared 384
  // = 3168. Model: 512 + 2336 + 3168 + 16 + 512 = 6544.
  CHECK(build(model_test::tiny_moe_config(1)).parameters().local_numel() == 6544);
  CHECK(build(model_test::tiny_moe_config(0)).parameters().local_numel() == 6544 - 384);
  // The torch-free count (DESIGN.md invariant 7) agrees with the built model.
  for (const auto& config : {model_test::tiny_config(false), model_test::tiny_config(true),
                             model_test::tiny_moe_config(1), model_test::tiny_moe_config(0, true)}) {
    CHECK(estimate::count_model(config, 8).total_params == build(config).parameters().local_numel());
  }
}

TEST_CASE("initial values depend only on seed - name - global shape", "[model][init]") {
  const auto config = model_test::tiny_moe_config(1);
  model::Transformer a = build(config, 7), b = build(config, 7), c = build(config, 8);
  const auto& pa = a.parameters().all();
  const auto& pb = b.parameters().all();
  const auto& pc = c.parameters().all();
  REQUIRE(pa.size() == pb.size());
  REQUIRE(pa.size() == pc.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    CAPTURE(pa[i].name);
    CHECK(at::equal(pa[i].tensor, pb[i].tensor));
    const bool is_norm = pa[i].name.find("norm") != std::string::npos;
    if (is_norm) {
      CHECK(at::equal(pa[i].tensor, at::ones_like(pa[i].tensor)));  // norms start at one
      CHECK(at::equal(pa[i].tensor, pc[i].tensor));
    } else {
      CHECK_FALSE(at::equal(pa[i].tensor, pc[i].tensor));  // another seed, other values
      // Exactly the global initial value of (seed, name, shape), whatever else the model holds.
      CHECK(at::equal(pa[i].tensor, model::global_initial_value(7, pa[i].name, pa[i].global_shape,
                                                                model::InitKind::Normal, 0.02)));
    }
  }
  // Different names give different values; the same name in another model (other parameters,
  // other order) gives the same values.
  CHECK_FALSE(at::equal(param(a.parameters(), "model.layers.0.mlp.gate_proj.weight"),
                        param(a.parameters(), "model.layers.0.mlp.up_proj.weight")));
  model::Transformer dense = build(model_test::tiny_config(true), 7);
  for (const std::string name : {"model.embed_tokens.weight", "model.layers.1.self_attn.o_proj.weight"})
    CHECK(at::equal(param(a.parameters(), name), param(dense.parameters(), name)));
  model::ParameterSet lone(model::ParameterOptions{7, 0.02});
  lone.create("model.layers.0.self_attn.k_proj.weight", {12, 16}, model::InitKind::Normal);
  CHECK(at::equal(param(lone, "model.layers.0.self_attn.k_proj.weight"),
                  param(a.parameters(), "model.layers.0.self_attn.k_proj.weight")));
}

TEST_CASE("initial values are normal with the configured standard deviation", "[model][init]") {
  const at::Tensor w = model::global_initial_value(3, "w", {256, 256}, model::InitKind::Normal, 0.05);
  CHECK(w.scalar_type() == at::kFloat);
  CHECK(w.mean().item<double>() == Approx(0.0).margin(0.05 * 0.02));
  CHECK(w.std().item<double>() == Approx(0.05).epsilon(0.02));
  CHECK(at::equal(model::global_initial_value(3, "z", {3, 2}, model::InitKind::Zeros, 0.05), at::zeros({3, 2})));
  CHECK(at::equal(model::global_initial_value(3, "o", {5}, model::InitKind::Ones, 0.05), at::ones({5})));
}

TEST_CASE("a shard is the slice of the global tensor", "[model][init]") {
  const std::string name = "model.layers.3.mlp.down_proj.weight";
  const std::vector<int64_t> shape = {6, 10};
  const at::Tensor global = model::global_initial_value(11, name, shape, model::InitKind::Normal, 0.02);
  model::ParameterSet whole(model::ParameterOptions{11, 0.02});
  CHECK(at::equal(whole.create(name, shape, model::InitKind::Normal).tensor, global));
  for (int64_t dim : {0, 1}) {
    CAPTURE(dim);
    std::vector<at::Tensor> halves;
    for (int64_t r : {0, 1}) {
      model::ParameterSet set(model::ParameterOptions{11, 0.02});
      const at::Tensor local =
          set.create(name, shape, model::InitKind::Normal, {model::ShardSpec::even(dim, shape[size_t(dim)], r, 2, mesh::GroupKind::Tp)})
              .tensor;
      const auto* p = set.find(name);
      REQUIRE(p);
      CHECK(p->global_shape == shape);
      CHECK(local.size(dim) == shape[dim] / 2);
      std::vector<int64_t> offsets(2, 0);
      offsets[dim] = r * shape[dim] / 2;
      CHECK(p->offsets() == offsets);
      CHECK(at::equal(local, global.narrow(dim, offsets[dim], shape[dim] / 2)));
      halves.push_back(local.detach());
    }
    CHECK(at::equal(at::cat(halves, dim), global));
  }
  // Equal shards of a dimension that does not split evenly are refused; uneven shards are slices at
  // their offset; a shard outside the shape and a name registered twice are refused.
  CHECK_THROWS(model::ShardSpec::even(0, 5, 0, 2, mesh::GroupKind::Tp));
  // Padded pieces: 10 real rows padded to 16 over 4 ranks are 4 rows each: 4, 4, 2 real + 2
  // padding, then padding only (at offset 10, length 0).
  for (int64_t r = 0; r < 4; ++r) {
    const auto b = model::ShardSpec::padded(10, 16, r, 4, mesh::GroupKind::Tp);
    CHECK(b.offset == std::vector<int64_t>{0, 4, 8, 10}[size_t(r)]);
    CHECK(b.length == std::vector<int64_t>{4, 4, 2, 0}[size_t(r)]);
    CHECK(b.padding == std::vector<int64_t>{0, 0, 2, 4}[size_t(r)]);
  }
  CHECK_THROWS(model::ShardSpec::padded(10, 15, 0, 4, mesh::GroupKind::Tp));  // 15 does not split in 4
  CHECK_THROWS(model::ShardSpec::padded(10, 8, 0, 4, mesh::GroupKind::Tp));   // shorter than the vocabulary
  model::ParameterSet set(model::ParameterOptions{11, 0.02});
  const model::Parameter& tail = set.create("odd", {5, 4}, model::InitKind::Normal, {model::ShardSpec{0, 3, 2, mesh::GroupKind::Tp}});
  CHECK(tail.offsets() == std::vector<int64_t>{3, 0});
  CHECK(at::equal(tail.tensor, model::global_initial_value(11, "odd", {5, 4}, model::InitKind::Normal, 0.02).narrow(0, 3, 2)));
  CHECK_THROWS(set.create("outside", {5, 4}, model::InitKind::Normal, {model::ShardSpec{1, 3, 2, mesh::GroupKind::Tp}}));
  // A slice owns storage of its own size: a row slice is not a view keeping the global tensor.
  const model::Parameter& rows =
      set.create("rows", {8, 4}, model::InitKind::Normal, {model::ShardSpec::even(0, 8, 1, 4, mesh::GroupKind::Tp)});
  CHECK(rows.tensor.storage().nbytes() == size_t(2 * 4 * rows.tensor.element_size()));
  // A padded shard: the real rows of the global value, then zero rows; real_part drops them.
  const model::Parameter& pad =
      set.create("pad", {5, 4}, model::InitKind::Normal, {model::ShardSpec::padded(5, 8, 1, 2, mesh::GroupKind::Tp)});
  CHECK(pad.tensor.sizes().vec() == std::vector<int64_t>{4, 4});
  CHECK(pad.real_sizes() == std::vector<int64_t>{1, 4});
  CHECK(pad.real_numel() == 4);
  CHECK(at::equal(pad.real_part(pad.tensor),
                  model::global_initial_value(11, "pad", {5, 4}, model::InitKind::Normal, 0.02).narrow(0, 4, 1)));
  CHECK(at::equal(pad.tensor.narrow(0, 1, 3), at::zeros({3, 4})));
  CHECK_THROWS(set.create("pad1", {4, 5}, model::InitKind::Normal,
                          {model::ShardSpec{1, 0, 4, mesh::GroupKind::Tp, 1}}));  // padding along dimension 1
  set.create("w", {4, 4}, model::InitKind::Normal);
  CHECK_THROWS(set.create("w", {4, 4}, model::InitKind::Normal));
}

TEST_CASE("tensor-parallel layers hold column and row slices of the global weights", "[model][init]") {
  const auto config = model_test::tiny_config();
  model::ModelOptions options;
  options.config = config;
  options.seed = 5;
  model::Transformer full(options);
  const std::vector<std::pair<std::string, int64_t>> sharded = {
      {"model.embed_tokens.weight", 0},             {"model.layers.0.self_attn.q_proj.weight", 0},
      {"model.layers.0.self_attn.k_proj.weight", 0}, {"model.layers.0.self_attn.o_proj.weight", 1},
      {"model.layers.1.mlp.up_proj.weight", 0},     {"model.layers.1.mlp.down_proj.weight", 1},
      {"lm_head.weight", 0}};
  std::vector<std::vector<at::Tensor>> parts(sharded.size());
  for (int64_t r : {0, 1}) {
    options.tp = model::TensorParallel{r, 2};
    model::Transformer shard(options);
    for (size_t i = 0; i < sharded.size(); ++i) {
      const auto* p = shard.parameters().find(sharded[i].first);
      REQUIRE(p);
      REQUIRE(p->shards.size() == 1);
      CHECK(p->shards[0].dim == sharded[i].second);
      CHECK(p->shards[0].group == mesh::GroupKind::Tp);
      parts[i].push_back(p->tensor.detach());
    }
    // Norms are replicated.
    CHECK(at::equal(param(shard.parameters(), "model.norm.weight"), param(full.parameters(), "model.norm.weight")));
  }
  for (size_t i = 0; i < sharded.size(); ++i) {
    CAPTURE(sharded[i].first);
    CHECK(at::equal(at::cat(parts[i], sharded[i].second), param(full.parameters(), sharded[i].first)));
  }
}

TEST_CASE("parameters take the model dtype: the rounded global value", "[model][init]") {
  model::Transformer bf16 = build(model_test::tiny_config(), 7, at::kBFloat16);
  model::Transformer fp32 = build(model_test::tiny_config(), 7, at::kFloat);
  model::Transformer fp64 = build(model_test::tiny_config(), 7, at::kDouble);
  for (size_t i = 0; i < fp32.parameters().all().size(); ++i) {
    const at::Tensor ref = fp32.parameters().all()[i].tensor;
    CHECK(bf16.parameters().all()[i].tensor.scalar_type() == at::kBFloat16);
    CHECK(at::equal(bf16.parameters().all()[i].tensor, ref.to(at::kBFloat16)));
    CHECK(at::equal(fp64.parameters().all()[i].tensor, ref.to(at::kDouble)));
  }
}
