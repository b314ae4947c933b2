#include "parallel/context/causal_sdpa.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "parallel/context/attention_block.h"

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GradInLayout : public torch::autograd::Function<GradInLayout> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->saved_data["sizes"] = x.sizes().vec();
    ctx->saved_data["strides"] = x.strides().vec();
    return x.alias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const auto strides = ctx->saved_data["strides"].toIntVector();
    if (!g.defined() || g.strides() == at::IntArrayRef(strides)) return {g};
    at::Tensor out = at::empty_strided(ctx->saved_data["sizes"].toIntVector(), strides, g.options());
    out.copy_(g);
    return {out};
  }
};

}  // namespace

at::Tensor grad_in_layout_of(const at::Tensor& x) {
  // Only a dense, non-overlapping layout can be allocated again as it is.
  if (!x.requires_grad() || !x.is_non_overlapping_and_dense()) return x;
  return GradInLayout::apply(x);
}

namespace {

// Sliding-window causal attention over the whole sequence: on CUDA the flash kernel with its window
// (bf16 or fp16, head size a multiple of 8 up to 256; grouped-query heads as they are), else
// ATen's attention with the band as an additive [s, s] mask, which autograd saves with the inputs.
at::Tensor windowed_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window) {
  const int64_t s = q.size(2), d = q.size(3);
  const bool flash = q.is_cuda() && (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) &&
                     d % 8 == 0 && d <= 256;
  if (flash) {
    // Query i attends keys [i - (window - 1), i]: left window - 1, right 0 (causal).
    const auto r = at::_flash_attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), std::nullopt,
                                                std::nullopt, s, s, /*dropout_p=*/0.0, /*is_causal=*/true,
                                                /*return_debug_mask=*/false, std::nullopt, window - 1, 0);
    return grad_in_layout_of(std::get<0>(r).transpose(1, 2));
  }
  const at::Tensor out = at::scaled_dot_product_attention(q, k, v, band_mask({0, window}, s, s, q.options()),
                                                          /*dropout_p=*/0.0, /*is_causal=*/false,
                                                          /*scale=*/std::nullopt, /*enable_gqa=*/q.size(1) != k.size(1));
  return out.is_cuda() ? grad_in_layout_of(out) : out;
}

// Document masking: each sample's documents (runs of equal ids) attended alone, causal with the
// window, and put back in sequence order: the work and the saved tensors of the documents'
// squares, not of the whole s x s product, for one kernel call per document (the ids come to the
// host once per call). q, k and v are split, not narrowed: the gradient of a split is one
// concatenation, where each narrowed slice's would be a zero-filled whole tensor.
at::Tensor per_document_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                             const at::Tensor& ids) {
  const at::Tensor host = ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t b = q.size(0), s = q.size(2);
  const auto qs = q.split(1, 0), ks = k.split(1, 0), vs = v.split(1, 0);
  std::vector<at::Tensor> samples;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t* id = host.data_ptr<int64_t>() + i * s;
    std::vector<int64_t> lengths;
    for (int64_t start = 0; start < s;) {
      int64_t end = start + 1;
      while (end < s && id[end] == id[start]) ++end;
      lengths.push_back(end - start);
      start = end;
    }
    if (lengths.size() == 1) {
      samples.push_back(causal_sdpa(qs[size_t(i)], ks[size_t(i)], vs[size_t(i)], window));
      continue;
    }
    const auto qd = qs[size_t(i)].split_with_sizes(lengths, 2), kd = ks[size_t(i)].split_with_sizes(lengths, 2),
               vd = vs[size_t(i)].split_with_sizes(lengths, 2);
    std::vector<at::Tensor> documents;
    for (size_t d = 0; d < lengths.size(); ++d) documents.push_back(causal_sdpa(qd[d], kd[d], vd[d], window));
    samples.push_back(at::cat(documents, 2));
  }
  return b == 1 ? samples[0] : at::cat(samples, 0);
}

}  // namespace

at::Tensor causal_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t window,
                       const at::Tensor& documents) {
  if (documents.defined()) return per_document_sdpa(q, k, v, window, documents);
  if (window > 0 && window < q.size(2)) return windowed_sdpa(q, k, v, window);
  const at::Tensor out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                                          /*enable_gqa=*/q.size(1) != k.size(1));
  // On CUDA only: the kernels concerned are there, and CPU runs stay as they were.
  return out.is_cuda() ? grad_in_layout_of(out) : out;
}

}  // namespace trainer::parallel
