#include "swiglu.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

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

// Contiguous gate and up (the common case: separate GEMM outputs): a flat loop over packs of
// 16 bytes, no index arithmetic per element.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__global__ void swiglu_forward_flat(const Pack<T, V>* gate, const Pack<T, V>* up, Pack<T, V>* out, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, V> g = gate[i], u = up[i];
    Pack<T, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = load(&g.v[j]);
      store(&y.v[j], gj * sigmoid(gj) * load(&u.v[j]));
    }
    out[i] = y;
  }
}

template <typename T, int V>
__global__ void swiglu_backward_flat(const Pack<T, V>* grad, const Pack<T, V>* gate, const Pack<T, V>* up,
                                     Pack<T, V>* grad_gate, Pack<T, V>* grad_up, int64_t packs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, V> dy = grad[i], g = gate[i], u = up[i];
    Pack<T, V> dg, du;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = load(&g.v[j]), uj = load(&u.v[j]), dyj = load(&dy.v[j]), sig = sigmoid(gj);
      store(&dg.v[j], dyj * uj * sig * (1.0f + gj * (1.0f - sig)));
      store(&du.v[j], dyj * gj * sig);
    }
    grad_gate[i] = dg;
    grad_up[i] = du;
  }
}

// Elements per 16-byte pack, or 0 when the pointers or the size do not allow packs.
template <typename T>
int pack_width(int64_t n, std::initializer_list<const void*> pointers) {
  constexpr int v = int(16 / sizeof(T));
  if (n % v != 0) return 0;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  return v;
}

template <typename T>
bool forward_flat(const void* gate, const void* up, void* out, int64_t n, cudaStream_t s) {
  constexpr int V = int(16 / sizeof(T));
  if (pack_width<T>(n, {gate, up, out}) == 0) return false;
  constexpr int threads = 256;
  swiglu_forward_flat<T, V><<<detail::grid_for(n / V, threads), threads, 0, s>>>(
      static_cast<const Pack<T, V>*>(gate), static_cast<const Pack<T, V>*>(up), static_cast<Pack<T, V>*>(out), n / V);
  return true;
}

template <typename T>
bool backward_flat(const void* grad, const void* gate, const void* up, void* grad_gate, void* grad_up, int64_t n,
                   cudaStream_t s) {
  constexpr int V = int(16 / sizeof(T));
  if (pack_width<T>(n, {grad, gate, up, grad_gate, grad_up}) == 0) return false;
  constexpr int threads = 256;
  swiglu_backward_flat<T, V><<<detail::grid_for(n / V, threads), threads, 0, s>>>(
      static_cast<const Pack<T, V>*>(grad), static_cast<const Pack<T, V>*>(gate), static_cast<const Pack<T, V>*>(up),
      static_cast<Pack<T, V>*>(grad_gate), static_cast<Pack<T, V>*>(grad_up), n / V);
  return true;
}

}  // namespace

void swiglu_forward(const void* gate, const void* up, void* out, int64_t rows, int64_t cols, int64_t gate_ld,
                    int64_t up_ld, ElementType type, Stream stream) {
  if (rows * cols == 0) return;
  constexpr int threads = 256;
  const unsigned blocks = detail::grid_for(rows * cols, threads);
  auto s = static_cast<cudaStream_t>(stream);
  const bool contiguous = gate_ld == cols && up_ld == cols;
  if (contiguous && (type == ElementType::BFloat16 ? forward_flat<__nv_bfloat16>(gate, up, out, rows * cols, s)
                                                   : forward_flat<float>(gate, up, out, rows * cols, s))) {
    detail::check_launch("swiglu_forward");
    return;
  }
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
  const bool contiguous = gate_ld == cols && up_ld == cols;
  if (contiguous &&
      (type == ElementType::BFloat16 ? backward_flat<__nv_bfloat16>(grad, gate, up, grad_gate, grad_up, rows * cols, s)
                                     : backward_flat<float>(grad, gate, up, grad_gate, grad_up, rows * cols, s))) {
    detail::check_launch("swiglu_backward");
    return;
  }
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
