// The attention core (SDPA, causal, grouped-query) against an explicit softmax(QK^T/sqrt(d) + mask) V.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "model/attention.h"
#include "model/rotary.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;
using model_test::param;

namespace {

// q [B, h, T, d], k and v [B, kv, T, d]: query head i reads kv head i / (h / kv) (Hugging Face
// repeat_kv), scores q.k / sqrt(d), keys after the query masked out, softmax written out.
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), kv = k.size(1);
  const int64_t group = h / kv;
  const at::Tensor mask = at::ones({t, t}, at::kBool).triu(1);  // key j > query i
  std::vector<at::Tensor> heads;
  for (int64_t i = 0; i < h; ++i) {
    const at::Tensor qi = q.select(1, i), ki = k.select(1, i / group), vi = v.select(1, i / group);
    at::Tensor scores = at::matmul(qi, ki.transpose(-1, -2)) / std::sqrt(double(d));  // [B, T, T]
    scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
    const at::Tensor e = at::exp(scores - std::get<0>(scores.max(-1, true)));
    heads.push_back(at::matmul(e / e.sum(-1, true), vi));
  }
  (void)b;
  return at::stack(heads, 1);
}

}  // namespace

TEST_CASE("Attention::core equals the naive causal GQA reference in double", "[model][attention]") {
  for (int64_t kv : {4, 2, 1}) {  // multi-head, grouped (2 queries per kv head), multi-query
    CAPTURE(kv);
    const at::Tensor q = model_test::randn({2, 4, 7, 8}, 1).requires_grad_(true);
    const at::Tensor k = model_test::randn({2, kv, 7, 8}, 2).requires_grad_(true);
    const at::Tensor v = model_test::randn({2, kv, 7, 8}, 3).requires_grad_(true);
    const at::Tensor out = model::Attention().core(q, k, v);  // no context parallelism: SDPA
    const at::Tensor ref = naive_attention(q, k, v);
    REQUIRE(out.sizes().vec() == std::vector<int64_t>{2, 4, 7, 8});
    CHECK(out.scalar_type() == at::kDouble);
    CHECK(max_relative_error(out, ref) < 1e-12);
    // The first query sees only the first key: its output is v at position 0 of its kv head.
    const int64_t group = 4 / kv;
    for (int64_t i = 0; i < 4; ++i) CHECK(max_relative_error(out[1][i][0], v[1][i / group][0]) < 1e-12);
    // Backward agrees too (grouped heads sum their kv gradients).
    const at::Tensor g = model_test::randn({2, 4, 7, 8}, 4);
    const auto grads = model_test::gradients((out * g).sum(), {q, k, v});
    const auto ref_grads = model_test::gradients((ref * g).sum(), {q, k, v});
    for (size_t j = 0; j < 3; ++j) CHECK(max_relative_error(grads[j], ref_grads[j]) < 1e-12);
  }
}

TEST_CASE("Attention::forward is o_proj of the core of rope(q_proj x) - rope(k_proj x) - v_proj x", "[model][attention]") {
  recipe::ModelConfig config = model_test::tiny_config();
  model::ParameterSet params(model::ParameterOptions{3, 0.3, at::kDouble});
  model::Attention attention(params, "model.layers.0.self_attn.", config, {});
  model::Rotary rotary(config.head_dim, config.rope_theta, std::nullopt);
  const int64_t b = 2, t = 5, h = 4, kv = 2, d = 6;
  auto [cos, sin] = rotary.cos_sin(at::arange(t, at::kLong), at::kDouble);
  // The layer works on [s, b, h] activations; the reference on [b, t, h].
  const at::Tensor x_sbh = model_test::randn({t, b, 16}, 9);
  const at::Tensor x = x_sbh.transpose(0, 1);
  auto project = [&](const std::string& name, int64_t heads) {
    return at::matmul(x, param(params, "model.layers.0.self_attn." + name + ".weight").t())
        .view({b, t, heads, d})
        .transpose(1, 2);
  };
  const at::Tensor q = model::Rotary::apply(project("q_proj", h), cos, sin);
  const at::Tensor k = model::Rotary::apply(project("k_proj", kv), cos, sin);
  const at::Tensor v = project("v_proj", kv);
  const at::Tensor core = naive_attention(q, k, v).transpose(1, 2).reshape({b, t, h * d});
  const at::Tensor ref = at::matmul(core, param(params, "model.layers.0.self_attn.o_proj.weight").t());
  CHECK(max_relative_error(attention.forward(x_sbh, cos, sin, false).transpose(0, 1), ref) < 1e-12);
  CHECK(max_relative_error(attention.forward(x_sbh, cos, sin, true).transpose(0, 1), ref) < 1e-12);
}

TEST_CASE("on a GPU the flash and cuDNN attention kernels agree in bf16 - outputs and gradients", "[model][cuda]") {
  // Attention::core calls scaled_dot_product_attention and ATen picks the kernel (the run prints
  // which: model/attention_backend.h). Each fused kernel alone, in our layout ([s, b, h, d] viewed
  // as [b, h, s, d]), causal, against the math kernel in fp32 on the same bf16 values.
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: the fused attention kernels not compared");
    return;
  }
  auto& context = at::globalContext();
  struct Restore {  // the kernel switches are global: put them back whatever happens
    at::Context& c;
    bool flash = c.userEnabledFlashSDP(), cudnn = c.userEnabledCuDNNSDP(), efficient = c.userEnabledMemEfficientSDP(),
         math = c.userEnabledMathSDP();
    ~Restore() { c.setSDPUseFlash(flash), c.setSDPUseCuDNN(cudnn), c.setSDPUseMemEfficient(efficient), c.setSDPUseMath(math); }
  } restore{context};
  auto only = [&](bool f, bool c, bool m) {
    context.setSDPUseFlash(f), context.setSDPUseCuDNN(c), context.setSDPUseMemEfficient(false), context.setSDPUseMath(m);
  };
  const int64_t s = 512, b = 2, h = 8, d = 64;
  at::manual_seed(5);
  const auto on_gpu = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
  // The output's gradient in the layout Attention::forward hands back: o_proj's input is the
  // output permuted to [s, b, h, d], so its gradient arrives in that memory order.
  const at::Tensor q0 = at::randn({s, b, h, d}, on_gpu), k0 = at::randn({s, b, h, d}, on_gpu),
                   v0 = at::randn({s, b, h, d}, on_gpu), dy_sbhd = at::randn({s, b, h, d}, on_gpu);
  at::Tensor dy = dy_sbhd.permute({1, 2, 0, 3});
  struct Result {
    at::Tensor y, dq, dk, dv;
  };
  auto attend = [&](c10::ScalarType dtype) {
    at::Tensor q = q0.to(dtype).requires_grad_(true), k = k0.to(dtype).requires_grad_(true),
               v = v0.to(dtype).requires_grad_(true);
    const at::Tensor y = at::scaled_dot_product_attention(q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}),
                                                          v.permute({1, 2, 0, 3}), {}, 0.0, /*is_causal=*/true);
    (y * dy.to(dtype)).sum().backward();
    return Result{y.detach().to(at::kFloat).cpu(), q.grad().to(at::kFloat).cpu(), k.grad().to(at::kFloat).cpu(),
                  v.grad().to(at::kFloat).cpu()};
  };
  only(false, false, true);
  const Result ref = attend(at::kFloat);
  only(true, false, false);
  const Result with_flash = attend(at::kBFloat16);
  only(false, true, false);
  const Result with_cudnn = attend(at::kBFloat16);
  for (const auto& [name, r] : {std::pair<const char*, const Result&>{"flash", with_flash}, {"cudnn", with_cudnn}}) {
    INFO(name);
    CHECK(max_relative_error(r.y, ref.y) < 2e-2);
    CHECK(max_relative_error(r.dq, ref.dq) < 3e-2);
    CHECK(max_relative_error(r.dk, ref.dk) < 3e-2);
    CHECK(max_relative_error(r.dv, ref.dv) < 3e-2);
  }
  CHECK(max_relative_error(with_flash.y, with_cudnn.y) < 2e-2);
  // A gradient in another memory order than the output's ([b, h, s, d] contiguous): ATen 2.11's
  // cuDNN backward was seen to return wrong gradients for it on an H200 (relative error ~1), flash
  // right ones. Attention never hands such a gradient to the kernel; reported, not required.
  dy = dy_sbhd.permute({1, 2, 0, 3}).contiguous();
  only(false, true, false);
  const Result other_layout = attend(at::kBFloat16);
  WARN("cuDNN with a contiguous [b, h, s, d] output gradient: dq error " << max_relative_error(other_layout.dq, ref.dq)
                                                                         << " (flash in the trainer's layout: "
                                                                         << max_relative_error(with_flash.dq, ref.dq) << ")");
}

TEST_CASE("on a GPU the Attention layer in bf16 matches itself in fp32 on the math kernel - gradients",
          "[model][cuda]") {
  // The layer as the trainer runs it (ATen picks cuDNN or flash for head_dim 64 in bf16) against
  // the same weights in fp32 on the math kernel: the output's gradient reaches the fused kernel in
  // the layer's own layout.
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: the Attention layer on the fused kernels not checked");
    return;
  }
  recipe::ModelConfig config = model_test::tiny_config();
  config.hidden_size = 256;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 64;
  const int64_t t = 384, b = 2;
  model::Rotary rotary(config.head_dim, config.rope_theta, std::nullopt);
  struct Grads {
    at::Tensor x, q_proj, o_proj;
  };
  auto run = [&](c10::ScalarType dtype, bool math_only) {
    auto& context = at::globalContext();
    const bool flash = context.userEnabledFlashSDP(), cudnn = context.userEnabledCuDNNSDP(),
               efficient = context.userEnabledMemEfficientSDP();
    if (math_only) context.setSDPUseFlash(false), context.setSDPUseCuDNN(false), context.setSDPUseMemEfficient(false);
    model::ParameterSet params(model::ParameterOptions{3, 0.05, dtype, c10::Device(at::kCUDA, 0)});
    model::Attention attention(params, "model.layers.0.self_attn.", config, {});
    auto [cos, sin] = rotary.cos_sin(at::arange(t, at::TensorOptions().dtype(at::kLong).device(at::kCUDA, 0)), dtype);
    const at::Tensor x = model_test::randn({t, b, config.hidden_size}, 4, dtype).to(at::kCUDA).requires_grad_(true);
    const at::Tensor dy = model_test::randn({t, b, config.hidden_size}, 5, dtype).to(at::kCUDA);
    (attention.forward(x, cos, sin, false) * dy).sum().backward();
    context.setSDPUseFlash(flash), context.setSDPUseCuDNN(cudnn), context.setSDPUseMemEfficient(efficient);
    auto grad = [&](const std::string& name) {
      return param(params, "model.layers.0.self_attn." + name + ".weight").grad().to(at::kFloat).cpu();
    };
    return Grads{x.grad().to(at::kFloat).cpu(), grad("q_proj"), grad("o_proj")};
  };
  const Grads ref = run(at::kFloat, true);
  const Grads fused = run(at::kBFloat16, false);
  CHECK(max_relative_error(fused.x, ref.x) < 3e-2);
  CHECK(max_relative_error(fused.q_proj, ref.q_proj) < 3e-2);
  CHECK(max_relative_error(fused.o_proj, ref.o_proj) < 3e-2);
}
