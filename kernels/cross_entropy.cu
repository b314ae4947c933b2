#include "cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "element_access.cuh"

namespace trainer::kernels {

namespace {

using detail::load;
using detail::Pack;  // 16 bytes of T, one 128-bit access
using detail::store;

constexpr int kScalarThreads = 512;  // the scalar row-statistics kernel's block (unaligned rows, odd widths)
constexpr int kMaxThreads = 1024;

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

// exp(x) for x <= 0 as 2^(x log2 e) on the SFU: ex2.approx.ftz.f32 (what __expf uses, without
// the fix-up of subnormal results that non-ftz code adds: 3 instructions a value). Relative error
// about 2^-22 plus the rounding of x log2 e; results below 2^-126 become 0; exp(-inf) = 0; NaN
// stays NaN.
__device__ __forceinline__ float exp_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

// Folds U packs into a running (maximum, sum): their maximum first, then one rescale of the sum
// and one exp per value, no branch per value. -inf values add nothing (a row of -inf so far stays
// (-inf, 0)); a NaN makes the sum NaN. The packs stay in their element type and each value is
// converted where used (U * V floats held at once spilled at 1024 threads). U a power of two
// (sums as a tree).
// The values' exps by exp_approx (2 instructions against expf's 9, which made this loop
// issue-bound on bf16): its error, like __expf's 2 + 1.17 |x| ulp, grows with |x| = maximum -
// value, so it is largest on the terms that weigh least; simulated over rows of 283 to 128256
// normal logits (scales 1 to 10) with ex2's 2^-22 all of one sign, the row's log-sum-exp moves
// by at most 3e-7 (the unit tests allow 1e-6 of the loss). Rescales of the sum stay expf.
template <typename T, int U>
__device__ __forceinline__ void absorb(MaxSum& acc, const Pack<T> (&p)[U]) {
  constexpr int V = Pack<T>::kSize;
  static_assert(U > 0 && (U & (U - 1)) == 0 && (V & (V - 1)) == 0, "absorb: powers of two");
  float m = acc.max;
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int j = 0; j < V; ++j) m = fmaxf(m, load(&p[u].v[j]));
  const float ref = m == -INFINITY ? 0.0f : m;  // all -inf: every exp below is exp(-inf) = 0
  float s[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float e[V];
#pragma unroll
    for (int j = 0; j < V; ++j) e[j] = exp_approx(load(&p[u].v[j]) - ref);
#pragma unroll
    for (int w = V / 2; w > 0; w /= 2)
#pragma unroll
      for (int j = 0; j < w; ++j) e[j] += e[j + w];
    s[u] = e[0];
  }
#pragma unroll
  for (int w = U / 2; w > 0; w /= 2)
#pragma unroll
    for (int j = 0; j < w; ++j) s[j] += s[j + w];
  acc.sum = acc.sum * expf(acc.max - ref) + s[0];
  acc.max = m;
}

// The block's (maximum, sum) in thread 0 (other threads: partial values). Every thread of the
// block calls it; blockDim.x a multiple of 32, at most kMaxThreads; warps: kMaxThreads / 32 slots
// of shared memory.
__device__ __forceinline__ MaxSum block_reduce(MaxSum acc, MaxSum* warps) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_down_sync(0xffffffffu, acc.max, offset), __shfl_down_sync(0xffffffffu, acc.sum, offset)};
    acc = merge(acc, other);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, count = blockDim.x / 32;
  if (lane == 0) warps[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < count ? warps[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset /= 2) {
      const MaxSum other{__shfl_down_sync(0xffffffffu, acc.max, offset),
                         __shfl_down_sync(0xffffffffu, acc.sum, offset)};
      acc = merge(acc, other);
    }
  }
  return acc;
}

// Thread 0's part: the row's statistics and its target's logit (read as one element).
template <typename T>
__device__ __forceinline__ void write_row(MaxSum total, const T* x, int64_t cols, int64_t row, const int64_t* target,
                                          float* row_max, float* sum_exp, float* target_logit) {
  row_max[row] = total.max;
  sum_exp[row] = total.sum;
  const int64_t t = target[row];
  target_logit[row] = t >= 0 && t < cols ? load(x + t) : 0.0f;
}

// Any row: one element per thread and step.
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
  __shared__ MaxSum warps[kMaxThreads / 32];
  const MaxSum total = block_reduce(acc, warps);
  if (threadIdx.x == 0) write_row(total, x, cols, row, target, row_max, sum_exp, target_logit);
}

// Rows of whole packs (16-byte aligned, cols and ld multiples of the pack). One block per row:
// the LM head's forward gives few rows (~130 per call) of the whole local vocabulary (128256
// columns), so a row needs a whole SM's worth of threads to keep enough loads in flight; warps of
// several rows per block would only pay off for short rows, which this kernel does not see in
// training. Each thread takes kUnroll packs blockDim.x apart per step, all loaded before any is
// used (64 bytes in flight per thread); the last step, with fewer than kUnroll packs left to the
// thread, reads the missing ones as -inf.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    row_stats_packs(const T* logits, int64_t cols, int64_t ld, const int64_t* target, float* row_max, float* sum_exp,
                    float* target_logit) {
  constexpr int V = Pack<T>::kSize, kUnroll = 4;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const Pack<T>* packs = reinterpret_cast<const Pack<T>*>(x);
  const int64_t n = cols / V, stride = blockDim.x;
  MaxSum acc{-INFINITY, 0.0f};
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    Pack<T> p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) p[u] = packs[i + u * stride];
    absorb(acc, p);
  }
  if (i < n) {
    Pack<T> p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * stride < n) {
        p[u] = packs[i + u * stride];
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) store(&p[u].v[e], -INFINITY);
      }
    }
    absorb(acc, p);
  }
  __shared__ MaxSum warps[kMaxThreads / 32];
  const MaxSum total = block_reduce(acc, warps);
  if (threadIdx.x == 0) write_row(total, x, cols, row, target, row_max, sum_exp, target_logit);
}

// Any row: one element per thread and step.
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

// One pack of the gradient; `first`: the column of its first element. bf16 takes exp_approx: its
// relative error (under 1e-5 wherever the result is not below 2^-100) vanishes in the rounding
// to bf16 (2^-9); fp32 keeps expf.
template <typename T>
__device__ __forceinline__ Pack<T> grad_pack(const Pack<T>& in, int64_t first, float l, int64_t t, float k) {
  constexpr int V = Pack<T>::kSize;
  const int lane = t >= first && t < first + V ? int(t - first) : -1;  // the target's place in the pack
  Pack<T> out;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float x = load(&in.v[j]) - l;
    const float p = sizeof(T) == 2 ? exp_approx(x) : expf(x);
    store(&out.v[j], (j == lane ? p - 1.0f : p) * k);
  }
  return out;
}

// Rows of whole packs (both logits and grad 16-byte aligned, cols, ld and grad_ld multiples of
// the pack). One block per row (the backward's slices: all rows of a micro-batch, ~2048
// columns). Two packs per thread and step, both read before either is written: grad may be
// logits itself, each pack read and then written by the one thread that owns it.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    logit_grad_packs(const T* logits, int64_t ld, T* grad, int64_t grad_ld, int64_t cols, const float* lse,
                     const int64_t* target, const float* coef) {
  constexpr int V = Pack<T>::kSize;
  const int64_t row = blockIdx.x;
  const float l = lse[row], k = coef[row];
  const int64_t t = target[row];
  const Pack<T>* x = reinterpret_cast<const Pack<T>*>(logits + row * ld);
  Pack<T>* g = reinterpret_cast<Pack<T>*>(grad + row * grad_ld);
  const int64_t n = cols / V, stride = blockDim.x;
  for (int64_t i = threadIdx.x; i < n; i += 2 * stride) {
    const bool second = i + stride < n;
    const Pack<T> a = x[i];
    Pack<T> b = a;
    if (second) b = x[i + stride];
    g[i] = grad_pack(a, i * V, l, t, k);
    if (second) g[i + stride] = grad_pack(b, (i + stride) * V, l, t, k);
  }
}

// Whether rows of T at p with stride ld and width cols are whole 16-byte packs.
template <typename T>
bool packable(const void* p, int64_t ld, int64_t cols) {
  constexpr int64_t V = Pack<T>::kSize;
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % V == 0 && cols % V == 0;
}

// Threads per block for rows of n packs: the fewest of 128, 256, 512, 1024 that leave at most
// `per_thread` packs to a thread (1024 for longer rows).
int threads_for(int64_t n, int per_thread) {
  int threads = 128;
  while (threads < kMaxThreads && int64_t(threads) * per_thread < n) threads *= 2;
  return threads;
}

template <typename T>
void row_stats(const T* logits, int64_t rows, int64_t cols, int64_t ld, const int64_t* target, float* row_max,
               float* sum_exp, float* target_logit, cudaStream_t s) {
  if (packable<T>(logits, ld, cols)) {
    // 8 packs (128 bytes) per thread at least: enough work to amortise the block's reduction.
    const int threads = threads_for(cols / Pack<T>::kSize, 8);
    row_stats_packs<<<unsigned(rows), threads, 0, s>>>(logits, cols, ld, target, row_max, sum_exp, target_logit);
  } else {
    row_stats_kernel<<<unsigned(rows), kScalarThreads, 0, s>>>(logits, cols, ld, target, row_max, sum_exp,
                                                                target_logit);
  }
}

template <typename T>
void logit_grad(const T* logits, int64_t ld, T* grad, int64_t grad_ld, int64_t rows, int64_t cols, const float* lse,
                const int64_t* target, const float* coef, cudaStream_t s) {
  if (packable<T>(logits, ld, cols) && packable<T>(grad, grad_ld, cols)) {
    // 2048 bf16 columns: 128 threads of 2 packs; many rows fill the GPU.
    const int threads = threads_for(cols / Pack<T>::kSize, 4);
    logit_grad_packs<<<unsigned(rows), threads, 0, s>>>(logits, ld, grad, grad_ld, cols, lse, target, coef);
  } else {
    logit_grad_kernel<<<unsigned(rows), 256, 0, s>>>(logits, ld, grad, grad_ld, cols, lse, target, coef);
  }
}

}  // namespace

void cross_entropy_row_stats(const void* logits, int64_t rows, int64_t cols, int64_t ld, const int64_t* target,
                             float* row_max, float* sum_exp, float* target_logit, ElementType type, Stream stream) {
  if (rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16)
    row_stats(static_cast<const __nv_bfloat16*>(logits), rows, cols, ld, target, row_max, sum_exp, target_logit, s);
  else
    row_stats(static_cast<const float*>(logits), rows, cols, ld, target, row_max, sum_exp, target_logit, s);
  detail::check_launch("cross_entropy_row_stats");
}

void cross_entropy_logit_grad(const void* logits, int64_t ld, void* grad, int64_t grad_ld, int64_t rows, int64_t cols,
                              const float* lse, const int64_t* target, const float* coef, ElementType type,
                              Stream stream) {
  if (rows == 0 || cols == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16)
    logit_grad(static_cast<const __nv_bfloat16*>(logits), ld, static_cast<__nv_bfloat16*>(grad), grad_ld, rows, cols,
               lse, target, coef, s);
  else
    logit_grad(static_cast<const float*>(logits), ld, static_cast<float*>(grad), grad_ld, rows, cols, lse, target, coef,
               s);
  detail::check_launch("cross_entropy_logit_grad");
}

}  // namespace trainer::kernels
