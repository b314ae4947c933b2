#pragma once
// Causal scaled_dot_product_attention as every attention path calls it (model::Attention at cp 1,
// Ulysses after its all-to-all), with the output's gradient handed to ATen's backward in the
// output's own memory layout. ATen 2.11's cuDNN attention backward returns wrong gradients when
// the output gradient is laid out differently from the output (measured on an H200: q, k, v
// [b, h, s, d] views of [s, b, h, d] tensors and a contiguous [b, h, s, d] gradient gave dq, dk,
// dv off by more than 100% of their size; flash was right): so on CUDA the gradient is restrided
// first when it differs (a copy; none in Attention's own layout).
#include <ATen/core/Tensor.h>

namespace trainer::parallel {

// q [b, h, s, d], k and v [b, kv, s, d] (kv dividing h: grouped-query attention). `window` > 0
// and shorter than s (model.sliding_window): each query attends itself and the window - 1 tokens
// before it (on CUDA through the flash kernel's window when it takes the inputs, else a mask).
// `documents` (data.document_masking; int64 [b, s], each position's document, numbered from 0 in
// each sample and increasing): only keys of the query's document, too. Each document runs alone,
// one causal attention (with the window) per document: the work of the documents' squares, not
// of the whole s x s product (ATen's variable-length flash path would take one call; it is not
// wired: checking it needs a GPU).
at::Tensor causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window = 0,
                       const at::Tensor& documents = at::Tensor());

// x itself in forward; in backward its gradient with x's strides (values unchanged).
at::Tensor grad_in_layout_of(const at::Tensor& x);

}  // namespace trainer::parallel
