#include "model/attention_backend.h"

#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/empty.h>

namespace trainer::model {

std::string sdpa_backend(c10::Device device, c10::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t seq = 128, batch = 1;
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  // [s, b, heads, d] viewed as [b, heads, s, d], as Attention::forward passes them.
  auto make = [&](int64_t h) { return at::empty({seq, batch, h, head_dim}, options).permute({1, 2, 0, 3}); };
  const at::Tensor q = make(heads), k = make(kv_heads), v = make(kv_heads);
  switch (static_cast<at::SDPBackend>(
      at::_fused_sdp_choice(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/heads != kv_heads))) {
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none";
  }
}

}  // namespace trainer::model
