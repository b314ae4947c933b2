#pragma once
// Loads and stores of the kernels' element types in fp32 arithmetic (device code only).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace trainer::kernels::detail {

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

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
