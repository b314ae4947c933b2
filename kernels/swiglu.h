#pragma once
// SwiGLU's activation product silu(gate) * up and its backward, one pass each, fp32 arithmetic
// and one rounding per output element (the unfused ops round silu(gate) and the products
// separately). Raw pointers; no torch or CUDA headers.
#include <cstdint>

#include "element_type.h"

namespace trainer::kernels {

// gate and up: [rows, cols] with row strides gate_ld and up_ld (columns contiguous); out written
// contiguous [rows, cols].
void swiglu_forward(const void* gate, const void* up, void* out, int64_t rows, int64_t cols, int64_t gate_ld,
                    int64_t up_ld, ElementType type, Stream stream);

// grad: contiguous [rows, cols], the product's gradient; grad_gate and grad_up written contiguous.
void swiglu_backward(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up, int64_t rows,
                     int64_t cols, int64_t gate_ld, int64_t up_ld, ElementType type, Stream stream);

}  // namespace trainer::kernels
