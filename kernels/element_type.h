#pragma once
// The element types the fused kernels take, named without CUDA or torch headers: callers pass raw
// pointers and say what they point at. Float32 exists so a GPU test can hold a kernel to its
// unfused reference within fp32 rounding; BFloat16 is what training runs.
#include <cstdint>

namespace trainer::kernels {

enum class ElementType { Float32, BFloat16 };

// The CUDA stream to launch on, as the runtime's opaque handle (cudaStream_t), so headers stay
// free of cuda_runtime.h.
using Stream = void*;

}  // namespace trainer::kernels
