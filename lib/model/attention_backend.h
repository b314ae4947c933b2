#pragma once
// Which kernel ATen's scaled_dot_product_attention picks for our attention (model/attention.cpp):
// flash, cuDNN, memory-efficient or the math fallback. The choice depends on the device, dtype,
// head counts and head size and on the tensors' layout, not on the sequence length, so it is
// asked once with a small causal problem laid out as Attention::forward lays out its own.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace trainer::model {

// "flash", "cudnn", "efficient", "math", "overrideable", or "none" when ATen finds no kernel.
std::string sdpa_backend(c10::Device device, c10::ScalarType dtype, int64_t heads, int64_t kv_heads, int64_t head_dim);

}  // namespace trainer::model
