#pragma once
// Rotary position embedding of the query and the key heads in one launch (Hugging Face Llama's
// rotate_half convention: y = x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1] over the
// two halves of a head), and its backward (the same pass with the transposed rotation). fp32
// arithmetic, one rounding per element. Raw pointers; no torch or CUDA headers.
#include <cstdint>

#include "element_type.h"

namespace trainer::kernels {

// One tensor to rotate: `in` holds [T, heads, D] rows with element strides stride_t and
// stride_head (the D values of a head contiguous); `out` is written contiguous [T, heads, D].
// In the backward pass `in` is the output's gradient and `out` the input's.
struct RopeTensor {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t stride_t = 0, stride_head = 0;
};

// cos and sin: contiguous [T, D] of the same element type. backward: apply the transposed
// rotation (the gradient). A tensor with heads == 0 is skipped.
void rope(const RopeTensor& q, const RopeTensor& k, const void* cos, const void* sin, int64_t tokens,
          int64_t head_dim, bool backward, ElementType type, Stream stream);

}  // namespace trainer::kernels
