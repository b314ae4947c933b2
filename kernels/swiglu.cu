#include "swiglu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "element_access.cuh"

namespace trainer::kernels {

namespace {

using detail::load;
using detail::store;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* out, int64_t rows, int64_t cols, int64_t gate_ld,
                                      int64_t up_ld) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float g = load(gate + r * gate_ld + c), u = load(up + r * up_ld + c);
    store(out + i, g * sigmoid(g) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* grad, const T* gate, const T* up, T* grad_gate, T* grad_up,
                                       int64_t rows, int64_t cols, int64_t gate_ld, int64_t up_ld) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float g = load(gate + r * gate_ld + c), u = load(up + r * up_ld + c), dy = load(grad + i);
    const float sig = sigmoid(g);
    // d/dg [g sigmoid(g)] = sigmoid(g) (1 + g (1 - sigmoid(g))).
    store(grad_gate + i, dy * u * sig * (1.0f + g * (1.0f - sig)));
    store(grad_up + i, dy * g * sig);
  }
}

}  // namespace

void swiglu_forward(const void* gate, const void* up, void* out, int64_t rows, int64_t cols, int64_t gate_ld,
                    int64_t up_ld, ElementType type, Stream stream) {
  if (rows * cols == 0) return;
  constexpr int threads = 256;
  const unsigned blocks = detail::grid_for(rows * cols, threads);
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16) {
    using T = __nv_bfloat16;
    swiglu_forward_kernel<T><<<blocks, threads, 0, s>>>(static_cast<const T*>(gate), static_cast<const T*>(up),
                                                        static_cast<T*>(out), rows, cols, gate_ld, up_ld);
  } else {
    swiglu_forward_kernel<float><<<blocks, threads, 0, s>>>(static_cast<const float*>(gate), static_cast<const float*>(up),
                                                            static_cast<float*>(out), rows, cols, gate_ld, up_ld);
  }
  detail::check_launch("swiglu_forward");
}

void swiglu_backward(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up, int64_t rows,
                     int64_t cols, int64_t gate_ld, int64_t up_ld, ElementType type, Stream stream) {
  if (rows * cols == 0) return;
  constexpr int threads = 256;
  const unsigned blocks = detail::grid_for(rows * cols, threads);
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16) {
    using T = __nv_bfloat16;
    swiglu_backward_kernel<T><<<blocks, threads, 0, s>>>(static_cast<const T*>(grad), static_cast<const T*>(gate),
                                                         static_cast<const T*>(up), static_cast<T*>(grad_gate),
                                                         static_cast<T*>(grad_up), rows, cols, gate_ld, up_ld);
  } else {
    swiglu_backward_kernel<float><<<blocks, threads, 0, s>>>(
        static_cast<const float*>(grad), static_cast<const float*>(gate), static_cast<const float*>(up),
        static_cast<float*>(grad_gate), static_cast<float*>(grad_up), rows, cols, gate_ld, up_ld);
  }
  detail::check_launch("swiglu_backward");
}

}  // namespace trainer::kernels
