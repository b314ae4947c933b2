#pragma once
// Loads and stores of the kernels' element types in fp32 arithmetic (device code only).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace trainer::kernels::detail {

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// 16 bytes of T (8 bf16 or 4 fp32), read and written with one 128-bit access: only at 16-byte
// aligned addresses, which the host checks before it launches a kernel on packs.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / int(sizeof(T));
  T v[kSize];
};

// One 128-bit load or store of a pack at p (16-byte aligned): through uint4, so that the compiler
// cannot split it into element accesses. load_pack_readonly: through the read-only data cache
// (for data no thread of the kernel writes).
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  Pack<T> r;
  memcpy(&r, &u, sizeof(r));
  return r;
}
template <typename T>
__device__ __forceinline__ Pack<T> load_pack_readonly(const T* p) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  Pack<T> r;
  memcpy(&r, &u, sizeof(r));
  return r;
}
template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& v) {
  uint4 u;
  memcpy(&u, &v, sizeof(u));
  *reinterpret_cast<uint4*>(p) = u;
}

// A pack's values in fp32 (bf16 two at a time) and back, rounding each once as store() does.
__device__ __forceinline__ void unpack(const Pack<float>& p, float (&out)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = p.v[i];
}
__device__ __forceinline__ void unpack(const Pack<__nv_bfloat16>& p, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const float2 f = __bfloat1622float2(__halves2bfloat162(p.v[i], p.v[i + 1]));
    out[i] = f.x;
    out[i + 1] = f.y;
  }
}
__device__ __forceinline__ void repack(const float (&in)[4], Pack<float>& p) {
#pragma unroll
  for (int i = 0; i < 4; ++i) p.v[i] = in[i];
}
__device__ __forceinline__ void repack(const float (&in)[8], Pack<__nv_bfloat16>& p) {
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(in[i], in[i + 1]);
    p.v[i] = h.x;
    p.v[i + 1] = h.y;
  }
}

// Blocks per grid for a grid-stride loop over n elements with `threads` per block.
inline unsigned grid_for(long long n, int threads) {
  long long blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 8) blocks = 65535LL * 8;
  return unsigned(blocks < 1 ? 1 : blocks);
}

// Throws when the launch just made failed (a bad configuration, no code for this GPU).
inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw std::runtime_error(std::string(kernel) + " launch failed: " + cudaGetErrorString(status));
}

}  // namespace trainer::kernels::detail
