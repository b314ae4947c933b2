#pragma once
// Rotary position embeddings in the Hugging Face Llama convention (rotate_half over the two halves
// of each head), with rope_theta and optional llama3 / linear / yarn frequency scaling.
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::model {

// The inverse frequencies for a head of `head_dim`, scaled as the recipe says (double precision).
std::vector<double> rotary_inverse_frequencies(int64_t head_dim, double theta,
                                               const std::optional<recipe::RopeScaling>& scaling);

// The factor cos and sin are multiplied by: yarn's attention factor, 1 otherwise.
double rotary_attention_factor(const std::optional<recipe::RopeScaling>& scaling);

class Rotary {
 public:
  Rotary() = default;
  Rotary(int64_t head_dim, double theta, const std::optional<recipe::RopeScaling>& scaling);

  // cos and sin of shape [T, head_dim] for the given positions (int64 [T]), in `dtype`.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& positions, c10::ScalarType dtype) const;

  // x: [B, heads, T, head_dim]; returns x * cos + rotate_half(x) * sin.
  static at::Tensor apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

 private:
  at::Tensor inverse_frequencies_;  // fp32 [head_dim / 2], CPU
  double attention_factor_ = 1.0;   // yarn: cos and sin scaled by it
};

}  // namespace trainer::model
