#include "model/attention.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <tuple>
#include <utility>

#include "model/fused_kernels.h"
#include "model/fused_ops.h"
#include "model/recompute.h"
#include "parallel/context/causal_sdpa.h"
#include "parallel/context/ring_attention.h"
#include "parallel/context/ulysses_attention.h"

namespace trainer::model {

Attention::Attention(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config,
                     TensorParallel tp, ContextParallel cp, bool fused_rope, int64_t window)
    : tp_(tp),
      cp_(cp),
      local_heads_(config.num_attention_heads / tp.size),
      local_kv_heads_(config.num_key_value_heads / tp.size),
      head_dim_(config.head_dim),
      fused_rope_(fused_rope),
      window_(window) {
  const int64_t h = config.hidden_size, d = config.head_dim;
  q_proj_ = Linear(params, prefix + "q_proj.weight", h, config.num_attention_heads * d, LinearKind::Column, tp);
  k_proj_ = Linear(params, prefix + "k_proj.weight", h, config.num_key_value_heads * d, LinearKind::Column, tp);
  v_proj_ = Linear(params, prefix + "v_proj.weight", h, config.num_key_value_heads * d, LinearKind::Column, tp);
  o_proj_ = Linear(params, prefix + "o_proj.weight", config.num_attention_heads * d, h, LinearKind::Row, tp);
  if (config.qk_norm) {
    // Replicated over tp, each rank normalising its own heads: the weights' gradients are partial
    // sums over the heads, so they are summed over tp too (with or without sequence parallelism).
    qk_norm_ = true;
    q_norm_ = RmsNorm(params, prefix + "q_norm.weight", d, config.rms_norm_eps);
    k_norm_ = RmsNorm(params, prefix + "k_norm.weight", d, config.rms_norm_eps);
    if (tp.size > 1)
      for (const char* name : {"q_norm.weight", "k_norm.weight"})
        params.find(prefix + name)->grad_group = mesh::GroupKind::TpDpCp;
  }
  if (config.attention_bias) {
    // Zeros at initialisation; no weight decay (as Megatron's and torchtitan's defaults for biases).
    const std::pair<const char*, int64_t> biases[] = {{"q_proj.bias", config.num_attention_heads * d},
                                                      {"k_proj.bias", config.num_key_value_heads * d},
                                                      {"v_proj.bias", config.num_key_value_heads * d}};
    for (const auto& [name, features] : biases) {
      std::vector<ShardSpec> shards;
      if (tp.size > 1) shards.push_back(ShardSpec::even(0, features, tp.rank, tp.size, mesh::GroupKind::Tp));
      qkv_bias_.push_back(params.create(prefix + name, {features}, InitKind::Zeros, std::move(shards),
                                        /*weight_decay=*/false).tensor);
    }
  }
}

at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ContextParallel& cp,
                          int64_t window, const at::Tensor& documents) {
  if (cp.size > 1) {
    // Each rank holds a zigzag part of the sequence: the ring's blocks and Ulysses' gathered
    // sequence build their masks from every position's document (the whole sequence's ids).
    return cp.method == ContextParallel::Method::Ring
               ? parallel::ring_attention(q, k, v, *cp.group, window, documents)
               : parallel::ulysses_attention(q, k, v, *cp.group, window, documents);
  }
  return parallel::causal_sdpa(q, k, v, window, documents);
}

at::Tensor Attention::core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& documents) const {
  return attention_core(q, k, v, cp_, window_, documents);
}

at::Tensor Attention::forward(const at::Tensor& x, const SequenceContext& seq, bool recompute_core,
                              const InputAgain& again) const {
  const at::Tensor& cos = seq.cos;
  const at::Tensor& sin = seq.sin;
  // One tp communication for the three column-parallel projections; with sequence parallelism x
  // is this rank's chunk of the sequence and the projections see the whole of it.
  auto qkv = Linear::forward_together(x, {&q_proj_, &k_proj_, &v_proj_}, again);
  for (size_t i = 0; i < qkv_bias_.size(); ++i) qkv[i] = qkv[i] + qkv_bias_[i];
  const int64_t t = qkv[0].size(0), b = qkv[0].size(1);
  // [s, b, heads, d]: rotary over the sequence (dimension 0), then [b, heads, s, d] views for SDPA.
  at::Tensor q_heads = qkv[0].view({t, b, local_heads_, head_dim_});
  at::Tensor k_heads = qkv[1].view({t, b, local_kv_heads_, head_dim_});
  if (qk_norm_) {  // the norm function (saving the input and an rsqrt per row), as lean layers run it
    q_heads = q_norm_.forward(q_heads, /*lean=*/true);
    k_heads = k_norm_.forward(k_heads, /*lean=*/true);
  }
  at::Tensor q, k;
  if (fused_rope_ && fusable(q_heads) && cos.dim() == 2) {  // the kernel takes positions shared by the batch
    std::tie(q, k) = fused::rope(q_heads, k_heads, cos, sin);
  } else {
    // [T, d], or [T, B, d] with positions per sample.
    const int64_t rows = cos.dim() == 3 ? b : 1;
    const at::Tensor cos4 = cos.view({t, rows, 1, head_dim_}), sin4 = sin.view({t, rows, 1, head_dim_});
    q = Rotary::apply(q_heads, cos4, sin4);
    k = Rotary::apply(k_heads, cos4, sin4);
  }
  q = q.permute({1, 2, 0, 3});
  k = k.permute({1, 2, 0, 3});
  const at::Tensor v = qkv[2].view({t, b, local_kv_heads_, head_dim_}).permute({1, 2, 0, 3});
  // [b, heads, s, d] -> [s, b, heads * d] for the row-parallel o_proj (a view: SDPA's output
  // follows the query's layout).
  auto core_out = [this, t, b, documents = seq.documents](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return core(q, k, v, documents).permute({2, 0, 1, 3}).reshape({t, b, local_heads_ * head_dim_});
  };
  // Recomputed, the core's output is o_proj's input and nobody keeps it: the core runs again at
  // the start of the block's backward, for o_proj's weight gradient and its own backward.
  if (recompute_core)
    return o_proj_.forward_recomputed(
        [core_out](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{core_out(in[0], in[1], in[2])}; },
        {q, k, v});
  return o_proj_.forward(core_out(q, k, v));
}

}  // namespace trainer::model
