#pragma once
// Causal scaled_dot_product_attention as every attention path calls it (model::Attention at cp 1,
// Ulysses after its all-to-all), with the output's gradient handed to ATen's backward in the
// output's own memory layout. ATen 2.11's cuDNN attention backward returns wrong gradients when
// the output gradient is laid out differently from the output (measured on an H200: q, k, v
// [b, h, s, d] views of [s, b, h, d] tensors and a contiguous [b, h, s, d] gradient gave dq, dk,
// dv off by more than 100% of their size; flash was right): so on CUDA the gradient is restrided
// first when it differs (a copy; none in Attention's own layout).
#include <ATen/core/Tensor.h>

#include "parallel/context/document_mask.h"

namespace trainer::parallel {

// q [b, h, s, d], k and v [b, kv, s, d] (kv dividing h: grouped-query attention). `window` > 0
// and shorter than s (model.sliding_window): each query attends itself and the window - 1 tokens
// before it (on CUDA through the flash kernel's window when it takes the inputs, else a mask).
// `documents` (data.document_masking): only keys of the query's document, too. On the CPU each
// document runs alone (its ids, [b, s]): one causal attention per document, whose cost is the sum
// of the documents' squares; on CUDA the boolean mask (`same`, built from the ids when absent)
// over the whole s x s product.
at::Tensor causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window = 0,
                       const DocumentMask& documents = {});

// x itself in forward; in backward its gradient with x's strides (values unchanged).
at::Tensor grad_in_layout_of(const at::Tensor& x);

}  // namespace trainer::parallel
