// The fused GPU kernels (model/fused_kernels.h) against the unfused ATen ops they replace: each
// kernel on its own with strided inputs, the chunked loss with ignored targets and a padded
// vocabulary, gradient accumulation by the GEMM, and whole models on CUDA (fp32: equal within fp32
// rounding; bf16: within bf16's). The CUDA cases need a GPU (the device machine runs them); the
// CPU case checks that the kernels' choice never changes a CPU run.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>

#include "cross_entropy.h"
#include "model/fused_kernels.h"
#include "model/fused_ops.h"
#include "model/linear_cross_entropy.h"
#include "counting/loss_chunks.h"
#include "model/rotary.h"
#include "model/transformer.h"
#include "model_test_util.h"
#include "rope.h"

using namespace trainer;
using model_test::max_relative_error;

namespace {

bool have_cuda() { return at::hasCUDA() && at::getNumGPUs() > 0; }

at::TensorOptions on_gpu(c10::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(at::kCUDA, 0); }

at::Tensor leaf(const at::Tensor& x) { return x.detach().clone().requires_grad_(true); }

double tolerance(c10::ScalarType dtype) { return dtype == at::kFloat ? 2e-6 : 1.6e-2; }

model::Transformer build(const recipe::ModelConfig& config, c10::ScalarType dtype, c10::Device device,
                         const model::FusedKernels& kernels, model::Recompute recompute) {
  model::ModelOptions options;
  options.config = config;
  options.seed = 9;
  options.dtype = dtype;
  options.device = device;
  options.kernels = kernels;
  options.recompute = recompute;
  return model::Transformer(options);
}

// Loss and every parameter's gradient of one forward and backward.
std::pair<at::Tensor, std::vector<at::Tensor>> loss_and_grads(model::Transformer& m, const at::Tensor& inputs,
                                                              const at::Tensor& targets) {
  const model::ForwardOutput out = m.forward(inputs, targets);
  out.loss_sum.backward();
  std::vector<at::Tensor> grads;
  for (auto& p : m.parameters().all()) grads.push_back(p.tensor.grad().to(at::kDouble).cpu());
  return {out.loss_sum.detach().to(at::kDouble).cpu(), grads};
}

recipe::ModelConfig odd_config() {
  recipe::ModelConfig c = model_test::tiny_config(/*tie=*/true);
  c.vocab_size = 1000;                  // 63 loss chunks, slices of 16 weight rows
  c.make_vocab_size_divisible_by = 64;  // padded to 1024: 24 rows out of the softmax
  return c;
}

}  // namespace

TEST_CASE("fused kernels leave a CPU run unchanged - the unfused ops run whatever the recipe says", "[model][fused]") {
  const recipe::ModelConfig c = odd_config();
  const at::Tensor inputs = model_test::random_tokens(2, 9, c.vocab_size, 1);
  at::Tensor targets = model_test::random_tokens(2, 9, c.vocab_size, 2);
  targets.index_put_({0, 3}, model::kIgnoreIndex);
  for (const auto recompute : {model::Recompute::None, model::Recompute::Selective}) {
    model::Transformer plain = build(c, at::kFloat, at::kCPU, {}, recompute);
    model::Transformer fused = build(c, at::kFloat, at::kCPU, model::FusedKernels::all(),
                                     recompute);
    const auto [loss_a, grads_a] = loss_and_grads(plain, inputs, targets);
    const auto [loss_b, grads_b] = loss_and_grads(fused, inputs, targets);
    CHECK(loss_a.item<double>() == loss_b.item<double>());
    for (size_t i = 0; i < grads_a.size(); ++i) CHECK(at::equal(grads_a[i], grads_b[i]));
  }
}

TEST_CASE("FusedKernels round-trip the recipe's list", "[model][fused]") {
  using K = recipe::FusedKernel;
  CHECK(model::FusedKernels::all().list() == recipe::all_fused_kernels());
  CHECK(model::FusedKernels::from({K::Rope}).list() == std::vector<K>{K::Rope});
  CHECK(model::FusedKernels::from({K::GradAccumulation, K::RmsNorm}).list() == std::vector<K>{K::RmsNorm, K::GradAccumulation});
  CHECK(model::FusedKernels{}.list().empty());
  CHECK_FALSE(model::fusable(at::zeros({2}, at::kBFloat16)));  // a CPU tensor
}

TEST_CASE("fused rope on CUDA equals Rotary::apply - strided q and k in forward and backward", "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused rope not checked");
    return;
  }
  const int64_t t = 13, b = 2, hq = 5, hk = 3, d = 10;
  model::Rotary rotary(d, 10000.0, std::nullopt);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    at::manual_seed(3);
    // q and k as strided views into one projection output, as a fused qkv GEMM would give them.
    const at::Tensor qk = at::randn({t, b, (hq + hk) * d}, on_gpu(dtype));
    const auto views = [&](const at::Tensor& x) {
      return std::make_pair(x.narrow(2, 0, hq * d).view({t, b, hq, d}), x.narrow(2, hq * d, hk * d).view({t, b, hk, d}));
    };
    const auto [cos, sin] = rotary.cos_sin(at::arange(7, 7 + t, on_gpu(at::kLong)), dtype);
    const at::Tensor c4 = cos.view({t, 1, 1, d}), s4 = sin.view({t, 1, 1, d});
    const at::Tensor gq = at::randn({t, b, hq, d}, on_gpu(dtype)), gk = at::randn({t, b, hk, d}, on_gpu(dtype));

    const at::Tensor base_a = leaf(qk), base_b = leaf(qk);
    const auto [qa, ka] = views(base_a);
    const at::Tensor ya = model::Rotary::apply(qa, c4, s4), za = model::Rotary::apply(ka, c4, s4);
    ((ya * gq).sum() + (za * gk).sum()).backward();
    const auto [qb, kb] = views(base_b);
    REQUIRE(!qb.is_contiguous());
    const auto [yb, zb] = model::fused::rope(qb, kb, cos, sin);
    CHECK(yb.is_contiguous());
    ((yb * gq).sum() + (zb * gk).sum()).backward();
    const double tol = tolerance(dtype);
    CHECK(max_relative_error(yb.to(at::kFloat).cpu(), ya.to(at::kFloat).cpu()) < tol);
    CHECK(max_relative_error(zb.to(at::kFloat).cpu(), za.to(at::kFloat).cpu()) < tol);
    CHECK(max_relative_error(base_b.grad().to(at::kFloat).cpu(), base_a.grad().to(at::kFloat).cpu()) < tol);
  }
}

namespace {

// The rotation of x ([t, heads, d], any strides) by cos and sin ([t, d]) in fp64: y1 = x1 c1 - x2 s1,
// y2 = x2 c2 + x1 s2 over the halves of a head (Rotary::apply), or its transpose (backward: the
// gradient of x from the gradient of y).
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor xd = x.to(at::kDouble), c = cos.to(at::kDouble).unsqueeze(1), s = sin.to(at::kDouble).unsqueeze(1);
  const at::Tensor x1 = xd.narrow(-1, 0, half), x2 = xd.narrow(-1, half, half);
  const at::Tensor c1 = c.narrow(-1, 0, half), c2 = c.narrow(-1, half, half);
  const at::Tensor s1 = s.narrow(-1, 0, half), s2 = s.narrow(-1, half, half);
  if (!backward) return at::cat({x1 * c1 - x2 * s1, x2 * c2 + x1 * s2}, -1);
  return at::cat({x1 * c1 + x2 * s2, x2 * c2 - x1 * s1}, -1);
}

}  // namespace

// The kernel on its own, both passes, against the fp64 rotation. Layouts: q and k in one qkv row
// per token (v's columns after them), each in its own contiguous tensor, and the gradients' layout
// out of attention ([heads, t, d] memory); head sizes 64 and 128 (packed), 16 (one pack a half in
// bf16), 8 (packed in fp32 only), 6 (never), and q and k one element off alignment (scalar).
TEST_CASE("rope kernel on CUDA equals an fp64 reference - packed heads - odd head sizes and unaligned views",
          "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: rope kernel not checked");
    return;
  }
  enum class Layout { Qkv, Separate, AttentionGrad, QkvOffByOne };
  struct Case {
    int64_t d, hq, hk;
    Layout layout;
  };
  const int64_t t = 37;
  const Case cases[] = {{64, 12, 4, Layout::Qkv},        {64, 12, 4, Layout::Separate},
                        {64, 12, 4, Layout::AttentionGrad}, {64, 12, 4, Layout::QkvOffByOne},
                        {128, 3, 1, Layout::AttentionGrad}, {16, 3, 0, Layout::Separate},
                        {8, 5, 2, Layout::Qkv},           {6, 5, 2, Layout::Separate}};
  for (const auto dtype : {at::kFloat, at::kBFloat16})
  for (const Case& cs : cases)
  for (const bool backward : {false, true}) {
    INFO("dtype " << dtype << " head size " << cs.d << " heads " << cs.hq << " + " << cs.hk << " layout "
                  << int(cs.layout) << " backward " << backward);
    at::manual_seed(5);
    const int64_t d = cs.d;
    model::Rotary rotary(d, 10000.0, std::nullopt);
    const auto [cos, sin] = rotary.cos_sin(at::arange(5, 5 + t, on_gpu(at::kLong)), dtype);
    // q and k as views of x's buffers: ([t, heads, d] with strides (stride_t, stride_head, 1)).
    at::Tensor q, k;
    if (cs.layout == Layout::Qkv || cs.layout == Layout::QkvOffByOne) {
      const int64_t off = cs.layout == Layout::QkvOffByOne ? 1 : 0, width = (cs.hq + 2 * cs.hk) * d + off;
      const at::Tensor qkv = at::randn({t * width}, on_gpu(dtype));
      q = qkv.as_strided({t, cs.hq, d}, {width, d, 1}, off);
      k = qkv.as_strided({t, cs.hk, d}, {width, d, 1}, off + cs.hq * d);
    } else if (cs.layout == Layout::Separate) {
      q = at::randn({t, cs.hq, d}, on_gpu(dtype));
      k = at::randn({t, cs.hk, d}, on_gpu(dtype));
    } else {
      q = at::randn({cs.hq, t, d}, on_gpu(dtype)).transpose(0, 1);
      k = at::randn({cs.hk, t, d}, on_gpu(dtype)).transpose(0, 1);
    }
    at::Tensor qo = at::full({t, cs.hq, d}, 7.0, on_gpu(dtype)), ko = at::full({t, cs.hk, d}, 7.0, on_gpu(dtype));
    const kernels::RopeTensor qt{q.data_ptr(), qo.data_ptr(), cs.hq, q.stride(0), q.stride(1)};
    const kernels::RopeTensor kt{cs.hk ? k.data_ptr() : nullptr, cs.hk ? ko.data_ptr() : nullptr, cs.hk, k.stride(0),
                                 k.stride(1)};
    kernels::rope(qt, kt, cos.data_ptr(), sin.data_ptr(), t, d, backward,
                  dtype == at::kFloat ? kernels::ElementType::Float32 : kernels::ElementType::BFloat16,
                  c10::cuda::getCurrentCUDAStream().stream());
    // One rounding of an fp32 result: 2^-24 (fp32) or 2^-9 (bf16) of the largest value, and some.
    const double tol = dtype == at::kFloat ? 1e-6 : 4e-3;
    CHECK(max_relative_error(qo.to(at::kDouble).cpu(), rope_reference(q, cos, sin, backward).cpu()) < tol);
    if (cs.hk) CHECK(max_relative_error(ko.to(at::kDouble).cpu(), rope_reference(k, cos, sin, backward).cpu()) < tol);
  }
}

// Through autograd as the model calls it at the bench's head size (64): q and k separate
// projection outputs [t, b, heads, d] (tensor parallel size 1), or views into one qkv row (one
// sequence: a strided view the kernel takes as it is); the output gradients in attention's layout.
// Packed in fp32 and bf16; the existing case above (head size 10) takes the scalar kernel.
TEST_CASE("fused rope on CUDA equals Rotary::apply - heads of 64 on 16-byte packs in forward and backward",
          "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused rope not checked");
    return;
  }
  const int64_t t = 33, hq = 8, hk = 2, d = 64;
  model::Rotary rotary(d, 500000.0, std::nullopt);
  for (const auto dtype : {at::kFloat, at::kBFloat16})
  for (const bool qkv_views : {false, true}) {
    INFO("dtype " << dtype << " qkv views " << qkv_views);
    const int64_t b = qkv_views ? 1 : 3;
    at::manual_seed(6);
    const at::Tensor base = at::randn({t, b, (hq + 2 * hk) * d}, on_gpu(dtype));
    const auto views = [&](const at::Tensor& x) {
      at::Tensor q = x.narrow(2, 0, hq * d), k = x.narrow(2, hq * d, hk * d);
      if (!qkv_views) {
        q = q.contiguous();
        k = k.contiguous();
      }
      return std::make_pair(q.view({t, b, hq, d}), k.view({t, b, hk, d}));
    };
    const auto [cos, sin] = rotary.cos_sin(at::arange(100, 100 + t, on_gpu(at::kLong)), dtype);
    const at::Tensor c4 = cos.view({t, 1, 1, d}), s4 = sin.view({t, 1, 1, d});
    // Gradients as attention's backward leaves them: [b, heads, t, d] memory seen as [t, b, heads, d].
    const at::Tensor gq = at::randn({b, hq, t, d}, on_gpu(dtype)).permute({2, 0, 1, 3});
    const at::Tensor gk = at::randn({b, hk, t, d}, on_gpu(dtype)).permute({2, 0, 1, 3});

    const at::Tensor base_a = leaf(base), base_b = leaf(base);
    const auto [qa, ka] = views(base_a);
    const at::Tensor ya = model::Rotary::apply(qa, c4, s4), za = model::Rotary::apply(ka, c4, s4);
    ((ya * gq).sum() + (za * gk).sum()).backward();
    const auto [qb, kb] = views(base_b);
    CHECK(qb.is_contiguous() == !qkv_views);
    const auto [yb, zb] = model::fused::rope(qb, kb, cos, sin);
    CHECK(yb.is_contiguous());
    ((yb * gq).sum() + (zb * gk).sum()).backward();
    const double tol = tolerance(dtype);
    CHECK(max_relative_error(yb.to(at::kFloat).cpu(), ya.to(at::kFloat).cpu()) < tol);
    CHECK(max_relative_error(zb.to(at::kFloat).cpu(), za.to(at::kFloat).cpu()) < tol);
    CHECK(max_relative_error(base_b.grad().to(at::kFloat).cpu(), base_a.grad().to(at::kFloat).cpu()) < tol);
    // The fp64 rotation of the same inputs bounds the fused output more tightly than bf16's
    // Rotary::apply (three roundings) does.
    const double one_rounding = dtype == at::kFloat ? 1e-6 : 4e-3;
    CHECK(max_relative_error(yb.reshape({t, b * hq, d}).to(at::kDouble).cpu(),
                             rope_reference(qb.reshape({t, b * hq, d}), cos, sin, false).cpu()) < one_rounding);
  }
}

namespace {

// The [bench] cases' timer: milliseconds per call of `call` on the current stream, over 50 calls
// after 3 warm-up calls.
double time_ms(const std::function<void()>& call) {
  for (int i = 0; i < 3; ++i) call();
  at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
  const int calls = 50;
  start.record();
  for (int i = 0; i < calls; ++i) call();
  end.record();
  end.synchronize();
  return double(start.elapsed_time(end)) / calls;
}

}  // namespace

// Not part of the suite ("[.]"; run it with unit_model "[bench]"): the rope kernel timed at the
// Llama 3.2 1B bench's shapes in bf16 (seq 4096, micro-batch 4, 32 query and 8 key/value heads of
// 64: 41.9M elements, 168 MB read and written a call), forward on the projections' outputs and
// backward on gradients in attention's layout, packed against scalar (the same tensors one
// element off 16-byte alignment).
TEST_CASE("rope kernel: time per call at the Llama 3.2 1B bench's shapes", "[.][bench]") {
  if (!have_cuda()) {
    WARN("no CUDA device: nothing timed");
    return;
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const int64_t t = 4096, b = 4, hq = 32, hk = 8, d = 64;
  const int64_t q_elems = t * b * hq * d, k_elems = t * b * hk * d;
  at::manual_seed(15);
  const at::Tensor in = at::randn({1 + q_elems + k_elems}, on_gpu(at::kBFloat16));
  at::Tensor out = at::empty({1 + q_elems + k_elems}, on_gpu(at::kBFloat16));
  const auto cos_sin = model::Rotary(d, 500000.0, std::nullopt).cos_sin(at::arange(t, on_gpu(at::kLong)), at::kBFloat16);
  const void *cos = cos_sin.first.data_ptr(), *sin = cos_sin.second.data_ptr();
  const double bytes = 2.0 * 2 * (q_elems + k_elems) + 2.0 * 2 * t * d;
  for (const bool backward : {false, true})
  for (const int64_t offset : {0, 1}) {
    char* i0 = static_cast<char*>(in.data_ptr()) + 2 * offset;
    char* o0 = static_cast<char*>(out.data_ptr()) + 2 * offset;
    // Forward: [t, b * heads, d] rows of the projections; backward: [b * heads, t, d] memory.
    const int64_t qs_t = backward ? d : b * hq * d, qs_h = backward ? t * d : d;
    const int64_t ks_t = backward ? d : b * hk * d, ks_h = backward ? t * d : d;
    const kernels::RopeTensor qt{i0, o0, b * hq, qs_t, qs_h};
    const kernels::RopeTensor kt{i0 + 2 * q_elems, o0 + 2 * q_elems, b * hk, ks_t, ks_h};
    const double ms = time_ms([&] {
      kernels::rope(qt, kt, cos, sin, t, d, backward, kernels::ElementType::BFloat16, stream);
    });
    WARN("rope " << (backward ? "backward" : "forward") << ", " << (offset == 0 ? "packed" : "scalar") << ": "
                 << ms * 1e3 << " us per call, " << bytes / (ms * 1e-3) / 1e12 << " TB/s read and written");
  }
}

TEST_CASE("fused swiglu on CUDA equals silu(gate) * up - strided halves in forward and backward", "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused swiglu not checked");
    return;
  }
  const int64_t rows = 37;
  // Halves of one tensor (strided rows, an odd width) and whole tensors (the packed path).
  for (const auto dtype : {at::kFloat, at::kBFloat16})
  for (const bool strided : {true, false}) {
    INFO("dtype " << dtype << " strided " << strided);
    const int64_t width = strided ? 77 : 96;
    at::manual_seed(4);
    const at::Tensor both = at::randn({rows, 2 * width}, on_gpu(dtype)) * 3;
    const at::Tensor gate = strided ? both.narrow(1, 0, width) : both.narrow(1, 0, width).contiguous();
    const at::Tensor up = strided ? both.narrow(1, width, width) : both.narrow(1, width, width).contiguous();
    const at::Tensor grad = at::randn({rows, width}, on_gpu(dtype));
    const at::Tensor ga = leaf(gate), ua = leaf(up);
    const at::Tensor ya = at::silu(ga) * ua;
    (ya * grad).sum().backward();
    const at::Tensor yb = model::fused::swiglu_product(gate, up);
    const auto [dg, du] = model::fused::swiglu_backward(grad, gate, up);
    const at::Tensor gc = leaf(gate), uc = leaf(up);
    (model::fused::swiglu(gc, uc) * grad).sum().backward();
    const double tol = tolerance(dtype);
    CHECK(max_relative_error(yb.to(at::kFloat).cpu(), ya.to(at::kFloat).cpu()) < tol);
    CHECK(max_relative_error(dg.to(at::kFloat).cpu(), ga.grad().to(at::kFloat).cpu()) < tol);
    CHECK(max_relative_error(du.to(at::kFloat).cpu(), ua.grad().to(at::kFloat).cpu()) < tol);
    CHECK(at::equal(gc.grad(), dg));
    CHECK(at::equal(uc.grad(), du));
  }
}

TEST_CASE("fused RMSNorm on CUDA through autograd equals ATen's fused backward and the fp64 reference",
          "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused RMSNorm not checked");
    return;
  }
  const int64_t rows = 29, width = 96;
  const double eps = 1e-5;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    at::manual_seed(6);
    const at::Tensor x = at::randn({rows, width}, on_gpu(dtype)), w = at::randn({width}, on_gpu(dtype)) * 0.1 + 1;
    const at::Tensor dy = at::randn({rows, width}, on_gpu(dtype));
    const at::Tensor xr = leaf(x.cpu().to(at::kDouble)), wr = leaf(w.cpu().to(at::kDouble));
    ((wr * (xr * at::rsqrt(xr.pow(2).mean(-1, true) + eps))) * dy.cpu().to(at::kDouble)).sum().backward();
    const at::Tensor xf = leaf(x), wf = leaf(w);
    const at::Tensor y = model::fused::rms_norm(xf, wf, eps);
    (y * dy).sum().backward();
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    CHECK(max_relative_error(xf.grad().cpu().to(at::kDouble), xr.grad()) < tol);
    CHECK(max_relative_error(wf.grad().cpu().to(at::kDouble), wr.grad()) < tol);
  }
}

TEST_CASE("fused cross-entropy on CUDA equals the unfused chunked loss - ignored targets and a padded vocabulary",
          "[model][fused][cuda][loss]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused cross-entropy not checked");
    return;
  }
  // 17 padding rows; forward rows of 283 columns (the scalar statistics kernel), backward slices of
  // 24 columns (packed) and a last one of 19 (scalar).
  const int64_t n = 45, hidden = 24, local = 300, vocab_end = 283;
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    std::vector<at::Tensor> losses, grad_h, grad_w;
    for (const bool use : {false, true}) {
      model::ParameterSet params(model::ParameterOptions{4, 0.5, dtype, c10::Device(at::kCUDA, 0)});
      model::Parameter& w = params.create("lm_head.weight", {local, hidden}, model::InitKind::Normal);
      w.main_grad = at::zeros(w.tensor.sizes(), on_gpu(at::kFloat));
      w.fused_grad_accumulation = use;
      at::manual_seed(8);
      const at::Tensor h = leaf(at::randn({n, hidden}, on_gpu(dtype)));
      at::Tensor targets = at::randint(0, vocab_end, {n}, on_gpu(at::kLong));
      targets[3] = -100;
      targets[40] = -100;
      const model::FusedKernels kernels = use ? model::FusedKernels::from({recipe::FusedKernel::CrossEntropy, recipe::FusedKernel::GradAccumulation})
                                              : model::FusedKernels{};
      const at::Tensor loss = model::linear_cross_entropy_sum(h, w, nullptr, targets, 0, vocab_end, -100, nullptr,
                                                              counting::loss_chunk_rows(n, local, hidden), kernels);
      (loss * 0.5).backward();
      losses.push_back(loss.detach().to(at::kDouble).cpu());
      grad_h.push_back(h.grad().to(at::kDouble).cpu());
      grad_w.push_back(w.main_grad.to(at::kDouble).cpu());
      CHECK(w.main_grad.narrow(0, vocab_end, local - vocab_end).abs().max().item<double>() == 0);
    }
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
    CHECK(max_relative_error(losses[1], losses[0]) < (dtype == at::kFloat ? 1e-6 : 1e-4));
    CHECK(max_relative_error(grad_h[1], grad_h[0]) < tol);
    CHECK(max_relative_error(grad_w[1], grad_w[0]) < tol);
  }
}

namespace {

// One layout of logits for the cross-entropy kernels: [rows, cols] at element `offset` of a
// buffer, row stride ld. Rows of whole 16-byte packs (pointer 16-byte aligned, cols and ld
// multiples of 8 bf16 / 4 fp32) take the packed kernels, any other row the scalar ones.
struct LogitLayout {
  int64_t rows, cols, ld, offset;
};

const LogitLayout kLogitLayouts[] = {
    {37, 2048, 2048, 0},      // packed: a backward slice's width, odd rows
    {37, 6000, 6000, 0},      // packed: 750 bf16 packs, not a multiple of the block; a short last step
    {3, 128256, 128256, 0},   // packed: Llama 3's vocabulary, 1024 threads a row
    {5, 24, 24, 0},           // packed: 3 bf16 packs, most threads idle
    {21, 2048, 2056, 8},      // packed: a strided view at an aligned offset
    {21, 1004, 1004, 0},      // fp32 packed (251 packs of 4), bf16 scalar (not a multiple of 8)
    {21, 1001, 1001, 0},      // scalar: odd width
    {21, 2048, 2049, 0},      // scalar: odd row stride
    {21, 2048, 2056, 1},      // scalar: a pointer one element off 16-byte alignment
};

// Each row's target column: random in [-1, cols) (-1: none here), and the first and last column,
// a pack's last and the next pack's first lane, where the rows allow.
at::Tensor logit_columns(const LogitLayout& l) {
  at::Tensor column = at::randint(-1, l.cols, {l.rows}, at::kLong);
  const int64_t fixed[] = {0, l.cols - 1, -1, 7, 8};
  for (int64_t r = 0; r < std::min<int64_t>(l.rows, 5); ++r) column[r] = std::min(fixed[r], l.cols - 1);
  return column;
}

}  // namespace

TEST_CASE("cross-entropy kernels on CUDA equal an fp64 reference - packed rows - odd widths - strides and offsets",
          "[model][fused][cuda][loss]") {
  if (!have_cuda()) {
    WARN("no CUDA device: cross-entropy kernels not checked");
    return;
  }
  for (const auto dtype : {at::kFloat, at::kBFloat16})
    for (const LogitLayout& l : kLogitLayouts) {
      INFO("dtype " << dtype << " rows " << l.rows << " cols " << l.cols << " ld " << l.ld << " offset " << l.offset);
      at::manual_seed(12);
      const at::Tensor buffer = (at::randn({l.offset + l.rows * l.ld}, on_gpu(at::kFloat)) * 3).to(dtype);
      const at::Tensor logits = buffer.as_strided({l.rows, l.cols}, {l.ld, 1}, l.offset);
      const at::Tensor column = logit_columns(l);
      const at::Tensor x = logits.to(at::kDouble).cpu();
      const at::Tensor here = column >= 0;

      const model::fused::RowStats stats = model::fused::cross_entropy_row_stats(logits, column.to(logits.device()));
      const at::Tensor max = std::get<0>(x.max(1));
      const at::Tensor sum_exp = (x - max.unsqueeze(1)).exp().sum(1);
      const at::Tensor target = at::where(here, x.gather(1, column.clamp_min(0).unsqueeze(1)).squeeze(1), 0.0);
      CHECK(at::equal(stats.max.cpu().to(at::kDouble), max));
      CHECK(at::equal(stats.target_logit.cpu().to(at::kDouble), target));
      CHECK((stats.sum_exp.cpu().to(at::kDouble) / sum_exp - 1).abs().max().item<double>() < 4e-6);

      // The gradient in place, around each row's maximum (so the probabilities reach 1 and a
      // misplaced value shows), with one row's coefficient 0 (an ignored row); the buffer outside
      // the view unchanged.
      at::Tensor grad_buffer = buffer.clone();
      at::Tensor grad = grad_buffer.as_strided({l.rows, l.cols}, {l.ld, 1}, l.offset);
      const at::Tensor lse = max.to(at::kFloat);
      at::Tensor coef = at::rand({l.rows}, at::kFloat) + 0.5;
      coef[l.rows / 2] = 0;
      model::fused::cross_entropy_logit_grad_(grad, lse.to(grad.device()), column.to(grad.device()),
                                              coef.to(grad.device()));
      const at::Tensor one_hot =
          at::zeros_like(x).scatter_(1, column.clamp_min(0).unsqueeze(1), here.to(at::kDouble).unsqueeze(1));
      const at::Tensor expected =
          ((x - lse.to(at::kDouble).unsqueeze(1)).exp() - one_hot) * coef.to(at::kDouble).unsqueeze(1);
      // bf16: one rounding, at most 2^-8 of a value.
      CHECK(max_relative_error(grad.to(at::kDouble).cpu(), expected) < (dtype == at::kFloat ? 2e-6 : 8e-3));
      at::Tensor outside = at::ones({l.offset + l.rows * l.ld}, at::kBool);
      outside.as_strided({l.rows, l.cols}, {l.ld, 1}, l.offset).fill_(false);
      CHECK(at::equal(grad_buffer.cpu().masked_select(outside), buffer.cpu().masked_select(outside)));
    }
}

// The chunked loss through the kernels at the widths training gives them: 2048-column backward
// slices over hidden 2048, forward rows of the whole local vocabulary; vocab_end 6000 makes every
// block of logits whole packs, 5999 makes the forward rows and the last slice (1903 columns) odd.
TEST_CASE("fused cross-entropy on CUDA equals the unfused chunked loss - 2048-column slices - packed and odd widths",
          "[model][fused][cuda][loss]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused cross-entropy not checked");
    return;
  }
  const int64_t n = 37, hidden = 2048, local = 6016;
  REQUIRE(counting::loss_vocab_slice(local, hidden) == 2048);
  for (const auto dtype : {at::kFloat, at::kBFloat16})
    for (const int64_t vocab_end : {6000, 5999}) {
      INFO("dtype " << dtype << " vocab_end " << vocab_end);
      std::vector<at::Tensor> losses, grad_h, grad_w;
      for (const bool use : {false, true}) {
        model::ParameterSet params(model::ParameterOptions{4, 0.5, dtype, c10::Device(at::kCUDA, 0)});
        model::Parameter& w = params.create("lm_head.weight", {local, hidden}, model::InitKind::Normal);
        w.main_grad = at::zeros(w.tensor.sizes(), on_gpu(at::kFloat));
        w.fused_grad_accumulation = use;
        at::manual_seed(13);
        // Logits of about unit scale: 0.05 * 0.5 * sqrt(2048).
        const at::Tensor h = leaf(at::randn({n, hidden}, on_gpu(dtype)) * 0.05);
        at::Tensor targets = at::randint(0, vocab_end, {n}, on_gpu(at::kLong));
        targets[5] = -100;
        targets[6] = vocab_end - 1;
        const model::FusedKernels kernels =
            use ? model::FusedKernels::from({recipe::FusedKernel::CrossEntropy, recipe::FusedKernel::GradAccumulation}) : model::FusedKernels{};
        const at::Tensor loss = model::linear_cross_entropy_sum(h, w, nullptr, targets, 0, vocab_end, -100, nullptr,
                                                                counting::loss_chunk_rows(n, local, hidden), kernels);
        (loss * 0.5).backward();
        losses.push_back(loss.detach().to(at::kDouble).cpu());
        grad_h.push_back(h.grad().to(at::kDouble).cpu());
        grad_w.push_back(w.main_grad.to(at::kDouble).cpu());
        CHECK(w.main_grad.narrow(0, vocab_end, local - vocab_end).abs().max().item<double>() == 0);
      }
      CHECK(max_relative_error(losses[1], losses[0]) < (dtype == at::kFloat ? 1e-6 : 1e-4));
      CHECK(max_relative_error(grad_h[1], grad_h[0]) < (dtype == at::kFloat ? 1e-5 : 2e-2));
      CHECK(max_relative_error(grad_w[1], grad_w[0]) < (dtype == at::kFloat ? 1e-5 : 2e-2));
    }
}

// Not part of the suite ("[.]"; run it with unit_model "[bench]"): the cross-entropy kernels
// timed at the Llama 3.2 1B bench's shapes in bf16, each call as the trainer makes it (forward:
// 131 rows of 128256 columns; backward: 8192 rows of 2048 columns in place), the packed kernels
// against the scalar ones (the same rows one element off 16-byte alignment).
TEST_CASE("cross-entropy kernels: time per call at the Llama 3.2 1B bench's shapes", "[.][bench]") {
  if (!have_cuda()) {
    WARN("no CUDA device: nothing timed");
    return;
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto bf16 = kernels::ElementType::BFloat16;
  at::manual_seed(14);
  {
    const int64_t rows = 131, cols = 128256;
    const at::Tensor buffer = at::randn({1 + rows * cols}, on_gpu(at::kBFloat16));
    const at::Tensor column = at::randint(-1, cols, {rows}, on_gpu(at::kLong));
    at::Tensor out = at::empty({3, rows}, on_gpu(at::kFloat));
    for (const int64_t offset : {0, 1}) {
      const void* logits = static_cast<const char*>(buffer.data_ptr()) + 2 * offset;
      const double ms = time_ms([&] {
        kernels::cross_entropy_row_stats(logits, rows, cols, cols, column.data_ptr<int64_t>(), out[0].data_ptr<float>(),
                                         out[1].data_ptr<float>(), out[2].data_ptr<float>(), bf16, stream);
      });
      WARN("row statistics, " << (offset == 0 ? "packed" : "scalar") << ": " << ms * 1e3 << " us per call, "
                              << 2.0 * rows * cols / (ms * 1e-3) / 1e12 << " TB/s read");
    }
  }
  {
    const int64_t rows = 8192, cols = 2048;
    at::Tensor buffer = at::randn({1 + rows * cols}, on_gpu(at::kBFloat16));
    const at::Tensor column = at::randint(-1, cols, {rows}, on_gpu(at::kLong));
    const at::Tensor lse = at::full({rows}, 12.0, on_gpu(at::kFloat)), coef = at::ones({rows}, on_gpu(at::kFloat));
    for (const int64_t offset : {0, 1}) {
      void* logits = static_cast<char*>(buffer.data_ptr()) + 2 * offset;
      const double ms = time_ms([&] {
        kernels::cross_entropy_logit_grad(logits, cols, logits, cols, rows, cols, lse.data_ptr<float>(),
                                          column.data_ptr<int64_t>(), coef.data_ptr<float>(), bf16, stream);
      });
      WARN("logit gradient in place, " << (offset == 0 ? "packed" : "scalar") << ": " << ms * 1e3 << " us per call, "
                                       << 4.0 * rows * cols / (ms * 1e-3) / 1e12 << " TB/s read and written");
    }
  }
}

TEST_CASE("gradient accumulation by the GEMM sums bf16 products into an fp32 main_grad", "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused gradient accumulation not checked");
    return;
  }
  model::ParameterSet params(model::ParameterOptions{4, 0.5, at::kBFloat16, c10::Device(at::kCUDA, 0)});
  model::Parameter& w = params.create("w", {19, 33}, model::InitKind::Normal);
  w.main_grad = at::full(w.tensor.sizes(), 0.5, on_gpu(at::kFloat));
  w.fused_grad_accumulation = true;
  int ready = 0;
  w.grad_ready = [&] { ++ready; };
  at::manual_seed(10);
  const at::Tensor a = at::randn({41, 19}, on_gpu(at::kBFloat16)), b = at::randn({41, 33}, on_gpu(at::kBFloat16));
  model::accumulate_gradient_mm(w, a.t(), b);
  model::accumulate_gradient_mm(w, a.t(), b);
  CHECK(ready == 2);
  const at::Tensor expected = 0.5 + 2 * at::mm(a.t().to(at::kDouble), b.to(at::kDouble));
  // fp32 accumulation of exact bf16 products: fp32 rounding only.
  CHECK(max_relative_error(w.main_grad.cpu().to(at::kDouble), expected.cpu()) < 1e-5);
  // ZeRO-2: main_grad exists only once grad_buffer() has made the bucket's buffer live; the first
  // contribution of a micro-batch takes the fused path too (a bf16 product would round: ~1e-3).
  model::Parameter& z = params.create("z", {19, 33}, model::InitKind::Normal);
  z.fused_grad_accumulation = true;
  z.grad_buffer = [&] {
    if (!z.main_grad.defined()) z.main_grad = at::zeros(z.tensor.sizes(), on_gpu(at::kFloat));
  };
  model::accumulate_gradient_mm(z, a.t(), b);
  REQUIRE(z.main_grad.defined());
  CHECK(max_relative_error(z.main_grad.cpu().to(at::kDouble), at::mm(a.t().to(at::kDouble), b.to(at::kDouble)).cpu()) <
        1e-5);
}

TEST_CASE("a model on CUDA with every fused kernel matches the unfused model - loss and gradients",
          "[model][fused][cuda]") {
  if (!have_cuda()) {
    WARN("no CUDA device: fused model not checked");
    return;
  }
  const recipe::ModelConfig c = odd_config();
  const c10::Device gpu(at::kCUDA, 0);
  const at::Tensor inputs = model_test::random_tokens(2, 9, c.vocab_size, 1).to(gpu);
  at::Tensor targets = model_test::random_tokens(2, 9, c.vocab_size, 2);
  targets.index_put_({1, 4}, model::kIgnoreIndex);
  targets = targets.to(gpu);
  const auto all = model::FusedKernels::all();
  for (const auto dtype : {at::kFloat, at::kBFloat16})
    for (const auto recompute : {model::Recompute::None, model::Recompute::Selective}) {
      INFO("dtype " << dtype << " selective " << (recompute == model::Recompute::Selective));
      model::Transformer plain = build(c, dtype, gpu, {}, recompute);
      model::Transformer fused = build(c, dtype, gpu, all, recompute);
      const auto [loss_a, grads_a] = loss_and_grads(plain, inputs, targets);
      const auto [loss_b, grads_b] = loss_and_grads(fused, inputs, targets);
      const double loss_error = max_relative_error(loss_b, loss_a);
      double grad_error = 0;
      for (size_t i = 0; i < grads_a.size(); ++i)
        grad_error = std::max(grad_error, max_relative_error(grads_b[i], grads_a[i]));
      WARN("fused vs unfused model, " << dtype << ": loss " << loss_error << ", gradients " << grad_error);
      CHECK(loss_error < (dtype == at::kFloat ? 1e-6 : 1e-2));
      CHECK(grad_error < (dtype == at::kFloat ? 1e-5 : 5e-2));
    }
}
