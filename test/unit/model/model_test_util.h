#pragma once
// Shared helpers of the lib/model unit tests: tiny configurations, seeded random tensors,
// parameter access by name, and a central-difference derivative.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/parameter.h"
#include "model/transformer.h"
#include "recipe/recipe.h"

namespace model_test {

using namespace trainer;

// V=32, H=16, I=24, 2 layers, 4 query heads and 2 kv heads (GQA) of head_dim 6 (heads*head_dim != H
// on purpose, so a transposed projection cannot go unnoticed).
inline recipe::ModelConfig tiny_config(bool tie = false) {
  recipe::ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tie;
  c.initializer_range = 0.02;
  c.make_vocab_size_divisible_by = 1;  // unpadded: the hand counts below; padding has its own tests
  return c;
}

// tiny_config with layer 1 a Mixtral MoE layer: 4 experts of width 8, top-2, optional shared experts.
inline recipe::ModelConfig tiny_moe_config(int64_t shared = 0, bool tie = false) {
  recipe::ModelConfig c = tiny_config(tie);
  recipe::MoeConfig moe;
  moe.num_local_experts = 4;
  moe.num_experts_per_tok = 2;
  moe.moe_intermediate_size = 8;
  moe.num_shared_experts = shared;
  moe.layers = {1};
  c.moe = moe;
  return c;
}

inline at::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

inline at::Tensor randn(std::vector<int64_t> shape, uint64_t seed, c10::ScalarType dtype = at::kDouble) {
  return at::randn(shape, generator(seed), at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

inline at::Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  return at::randint(vocab, {b, t}, generator(seed), at::TensorOptions().dtype(at::kLong));
}

inline at::Tensor param(const model::ParameterSet& params, const std::string& name) {
  const model::Parameter* p = params.find(name);
  if (!p) throw std::logic_error("no parameter " + name);
  return p->tensor;
}

// d loss / d each of `inputs` (undefined where it does not depend on one), leaving .grad untouched.
inline std::vector<at::Tensor> gradients(const at::Tensor& loss, const std::vector<at::Tensor>& inputs) {
  return torch::autograd::grad({loss}, inputs, /*grad_outputs=*/{}, /*retain_graph=*/true, /*create_graph=*/false,
                               /*allow_unused=*/true);
}

inline void clear_grads(model::ParameterSet& params) {
  for (auto& p : params.all()) p.tensor.mutable_grad() = at::Tensor();
}

// Central difference (f(w + eps) - f(w - eps)) / (2 eps) of a scalar function with respect to the
// flat entry `index` of the leaf `w`, restoring w afterwards.
inline double central_difference(const at::Tensor& w, int64_t index, double eps, const std::function<double()>& f) {
  at::NoGradGuard no_grad;
  at::Tensor flat = w.view({-1});
  const double original = flat[index].item<double>();
  flat[index].fill_(original + eps);
  const double plus = f();
  flat[index].fill_(original - eps);
  const double minus = f();
  flat[index].fill_(original);
  return (plus - minus) / (2 * eps);
}

// Fourth-order central difference (8 (f(w+h) - f(w-h)) - (f(w+2h) - f(w-2h))) / (12 h): a step
// large enough to swamp fp32 rounding inside a double model keeps a small truncation error.
inline double central_difference4(const at::Tensor& w, int64_t index, double h, const std::function<double()>& f) {
  at::NoGradGuard no_grad;
  at::Tensor flat = w.view({-1});
  const double original = flat[index].item<double>();
  auto at_offset = [&](double offset) {
    flat[index].fill_(original + offset);
    return f();
  };
  const double d1 = at_offset(h) - at_offset(-h), d2 = at_offset(2 * h) - at_offset(-2 * h);
  flat[index].fill_(original);
  return (8 * d1 - d2) / (12 * h);
}

// Largest |a - b| relative to max(|b|max, floor): one number for "these tensors agree".
inline double max_relative_error(const at::Tensor& a, const at::Tensor& b, double floor = 1e-30) {
  const double scale = std::max(b.abs().max().item<double>(), floor);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

}  // namespace model_test
