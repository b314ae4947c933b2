#include "cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "element_access.cuh"

namespace trainer::kernels {

namespace {

using detail::load;
using detail::store;

constexpr int kThreads = 512;

// A running (maximum, sum of exp(x - maximum)) pair; merging two rescales the smaller side.
struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

template <typename T>
__global__ void row_stats_kernel(const T* logits, int64_t cols, int64_t ld, const int64_t* target, float* row_max,
                                 float* sum_exp, float* target_logit) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = load(x + c);
    if (v > acc.max) {
      acc.sum = (acc.max == -INFINITY ? 0.0f : acc.sum * expf(acc.max - v)) + 1.0f;
      acc.max = v;
    } else {
      acc.sum += expf(v - acc.max);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_down_sync(0xffffffffu, acc.max, offset), __shfl_down_sync(0xffffffffu, acc.sum, offset)};
    acc = merge(acc, other);
  }
  __shared__ MaxSum warps[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warps[0];
    for (int w = 1; w < int(blockDim.x / 32); ++w) total = merge(total, warps[w]);
    row_max[row] = total.max;
    sum_exp[row] = total.sum;
    const int64_t t = target[row];
    target_logit[row] = t >= 0 && t < cols ? load(x + t) : 0.0f;
  }
}

template <typename T>
__global__ void logit_grad_kernel(const T* logits, int64_t ld, T* grad, int64_t grad_ld, int64_t cols, const float* lse,
                                  const int64_t* target, const float* coef) {
  const int64_t row = blockIdx.x;
  const float l = lse[row], k = coef[row];
  const int64_t t = target[row];
  const T* x = logits + row * ld;
  T* g = grad + row * grad_ld;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float p = expf(load(x + c) - l);
    store(g + c, (c == t ? p - 1.0f : p) * k);
  }
}

}  // namespace

void cross_entropy_row_stats(const void* logits, int64_t rows, int64_t cols, int64_t ld, const int64_t* target,
                             float* row_max, float* sum_exp, float* target_logit, ElementType type, Stream stream) {
  if (rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16)
    row_stats_kernel<<<unsigned(rows), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), cols, ld, target,
                                                         row_max, sum_exp, target_logit);
  else
    row_stats_kernel<<<unsigned(rows), kThreads, 0, s>>>(static_cast<const float*>(logits), cols, ld, target, row_max,
                                                         sum_exp, target_logit);
  detail::check_launch("cross_entropy_row_stats");
}

void cross_entropy_logit_grad(const void* logits, int64_t ld, void* grad, int64_t grad_ld, int64_t rows, int64_t cols,
                              const float* lse, const int64_t* target, const float* coef, ElementType type,
                              Stream stream) {
  if (rows == 0 || cols == 0) return;
  constexpr int threads = 256;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16)
    logit_grad_kernel<<<unsigned(rows), threads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), ld,
                                                         static_cast<__nv_bfloat16*>(grad), grad_ld, cols, lse, target,
                                                         coef);
  else
    logit_grad_kernel<<<unsigned(rows), threads, 0, s>>>(static_cast<const float*>(logits), ld, static_cast<float*>(grad),
                                                         grad_ld, cols, lse, target, coef);
  detail::check_launch("cross_entropy_logit_grad");
}

}  // namespace trainer::kernels
