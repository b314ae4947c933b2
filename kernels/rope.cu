#include "rope.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "element_access.cuh"

namespace trainer::kernels {

namespace {

using detail::load;
using detail::Pack;
using detail::store;

constexpr int kThreads = 256;

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

// Thread per pack pair: the V pairs (j + i, j + half + i), i < V, of one head of one token (V = 8
// bf16 or 4 fp32), read as two 16-byte packs, with cos and sin as four packs of their token's row
// (the same for every head of the token: L1 hits). q's packs first, then k's. 32-bit indices (the
// host checks that every pack has one) and no 64-bit division: about 12 instructions an element
// (sm_90 SASS: 196 a loop of 16 bf16, 101 of 8 fp32), against the 27 that 4.3 TB/s of bf16 leaves.
// The arithmetic and its rounding are the scalar kernel's.
template <typename T, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    rope_packs(RopeTensor q, RopeTensor k, const T* __restrict__ cos, const T* __restrict__ sin, uint32_t q_packs,
               uint32_t total, uint32_t half_packs, uint32_t q_heads, uint32_t k_heads, uint32_t head_dim) {
  constexpr int V = Pack<T>::kSize;
  const uint32_t half = half_packs * V;
  for (uint32_t p = blockIdx.x * blockDim.x + threadIdx.x; p < total; p += gridDim.x * blockDim.x) {
    // Field by field (not a reference to q or k: that would put the parameters on the stack).
    const bool is_q = p < q_packs;
    const T* in_base = static_cast<const T*>(is_q ? q.in : k.in);
    T* out_base = static_cast<T*>(is_q ? q.out : k.out);
    const int64_t stride_t = is_q ? q.stride_t : k.stride_t, stride_head = is_q ? q.stride_head : k.stride_head;
    const uint32_t heads = is_q ? q_heads : k_heads;
    const uint32_t local = is_q ? p : p - q_packs;
    const uint32_t row = local / half_packs;  // t * heads + head
    const uint32_t j = (local - row * half_packs) * V;
    const uint32_t t = row / heads, head = row - t * heads;
    const T* in = in_base + (int64_t(t) * stride_t + int64_t(head) * stride_head) + j;
    T* out = out_base + int64_t(row) * head_dim + j;
    const size_t c = size_t(t) * head_dim + j;

    float x1[V], x2[V], c1[V], c2[V], s1[V], s2[V], o1[V], o2[V];
    // The six loads issued before any is used: two of x from memory, four of cos and sin (L1).
    const Pack<T> px1 = detail::load_pack(in), px2 = detail::load_pack(in + half);
    const Pack<T> pc1 = detail::load_pack_readonly(cos + c), pc2 = detail::load_pack_readonly(cos + c + half);
    const Pack<T> ps1 = detail::load_pack_readonly(sin + c), ps2 = detail::load_pack_readonly(sin + c + half);
    detail::unpack(px1, x1);
    detail::unpack(px2, x2);
    detail::unpack(pc1, c1);
    detail::unpack(pc2, c2);
    detail::unpack(ps1, s1);
    detail::unpack(ps2, s2);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (!kBackward) {
        o1[i] = x1[i] * c1[i] - x2[i] * s1[i];
        o2[i] = x2[i] * c2[i] + x1[i] * s2[i];
      } else {
        // The transpose of the forward map: d x1 = g1 c1 + g2 s2, d x2 = g2 c2 - g1 s1.
        o1[i] = x1[i] * c1[i] + x2[i] * s2[i];
        o2[i] = x2[i] * c2[i] - x1[i] * s1[i];
      }
    }
    Pack<T> a, b;
    detail::repack(o1, a);
    detail::repack(o2, b);
    detail::store_pack(out, a);
    detail::store_pack(out + half, b);
  }
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether x's heads are whole packs in each half: both pointers 16-byte aligned and both strides
// multiples of a pack (head_dim / 2 is checked by the caller). A tensor with no heads is skipped.
template <typename T>
bool packable(const RopeTensor& x) {
  constexpr int64_t V = Pack<T>::kSize;
  return x.heads == 0 || (aligned(x.in) && aligned(x.out) && x.stride_t % V == 0 && x.stride_head % V == 0);
}

template <typename T>
void launch(const RopeTensor& q, const RopeTensor& k, const T* cos, const T* sin, int64_t tokens, int64_t head_dim,
            bool backward, cudaStream_t s) {
  constexpr int64_t V = Pack<T>::kSize;
  const int64_t half_packs = head_dim / 2 / V;
  const int64_t q_packs = tokens * q.heads * half_packs, total = q_packs + tokens * k.heads * half_packs;
  if (head_dim % (2 * V) == 0 && aligned(cos) && aligned(sin) && packable<T>(q) && packable<T>(k) &&
      total <= INT32_MAX) {
    const unsigned blocks = detail::grid_for(total, kThreads);
    if (backward)
      rope_packs<T, true><<<blocks, kThreads, 0, s>>>(q, k, cos, sin, uint32_t(q_packs), uint32_t(total),
                                                      uint32_t(half_packs), uint32_t(q.heads), uint32_t(k.heads),
                                                      uint32_t(head_dim));
    else
      rope_packs<T, false><<<blocks, kThreads, 0, s>>>(q, k, cos, sin, uint32_t(q_packs), uint32_t(total),
                                                       uint32_t(half_packs), uint32_t(q.heads), uint32_t(k.heads),
                                                       uint32_t(head_dim));
  } else {
    // Heads that are not whole packs (odd halves, strides, a view off alignment): one pair a thread.
    const long long pairs = (long long)tokens * (q.heads + k.heads) * (head_dim / 2);
    rope_kernel<T><<<detail::grid_for(pairs, kThreads), kThreads, 0, s>>>(q, k, cos, sin, tokens, head_dim, backward);
  }
}

}  // namespace

void rope(const RopeTensor& q, const RopeTensor& k, const void* cos, const void* sin, int64_t tokens,
          int64_t head_dim, bool backward, ElementType type, Stream stream) {
  const long long pairs = (long long)tokens * (q.heads + k.heads) * (head_dim / 2);
  if (pairs == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == ElementType::BFloat16)
    launch(q, k, static_cast<const __nv_bfloat16*>(cos), static_cast<const __nv_bfloat16*>(sin), tokens, head_dim,
           backward, s);
  else
    launch(q, k, static_cast<const float*>(cos), static_cast<const float*>(sin), tokens, head_dim, backward, s);
  detail::check_launch("rope");
}

}  // namespace trainer::kernels
