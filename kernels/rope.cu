#include "rope.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "element_access.cuh"

namespace trainer::kernels {

namespace {

using detail::load;
using detail::store;

// Thread per pair (j, j + D/2) of one head of one token; q's pairs first, then k's.
template <typename T>
__global__ void rope_kernel(RopeTensor q, RopeTensor k, const T* cos, const T* sin, int64_t tokens,
                            int64_t head_dim, bool backward) {
  const int64_t half = head_dim / 2;
  const int64_t q_pairs = tokens * q.heads * half, total = q_pairs + tokens * k.heads * half;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += int64_t(gridDim.x) * blockDim.x) {
    const bool is_q = p < q_pairs;
    const RopeTensor& x = is_q ? q : k;
    const int64_t local = is_q ? p : p - q_pairs;
    const int64_t j = local % half, row = local / half;
    const int64_t head = row % x.heads, t = row / x.heads;
    const T* in = static_cast<const T*>(x.in) + t * x.stride_t + head * x.stride_head;
    T* out = static_cast<T*>(x.out) + (t * x.heads + head) * head_dim;
    const float x1 = load(in + j), x2 = load(in + j + half);
    const float c1 = load(cos + t * head_dim + j), c2 = load(cos + t * head_dim + j + half);
    const float s1 = load(sin + t * head_dim + j), s2 = load(sin + t * head_dim + j + half);
    if (!backward) {
      store(out + j, x1 * c1 - x2 * s1);
      store(out + j + half, x2 * c2 + x1 * s2);
    } else {
      // The transpose of the forward map: d x1 = g1 c1 + g2 s2, d x2 = g2 c2 - g1 s1.
      store(out + j, x1 * c1 + x2 * s2);
      store(out + j + half, x2 * c2 - x1 * s1);
    }
  }
}

}  // namespace

void rope(const RopeTensor& q, const RopeTensor& k, const void* cos, const void* sin, int64_t tokens,
          int64_t head_dim, bool backward, ElementType type, Stream stream) {
  const long long pairs = (long long)tokens * (q.heads + k.heads) * (head_dim / 2);
  if (pairs == 0) return;
  constexpr int threads = 256;
  const unsigned blocks = detail::grid_for(pairs, threads);
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16)
    rope_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(q, k, static_cast<const __nv_bfloat16*>(cos),
                                                         static_cast<const __nv_bfloat16*>(sin), tokens, head_dim,
                                                         backward);
  else
    rope_kernel<float><<<blocks, threads, 0, s>>>(q, k, static_cast<const float*>(cos), static_cast<const float*>(sin),
                                                  tokens, head_dim, backward);
  detail::check_launch("rope");
}

}  // namespace trainer::kernels
