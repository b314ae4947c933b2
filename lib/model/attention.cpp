#include "model/attention.h"

#include <ATen/ATen.h>

#include "model/recompute.h"

namespace trainer::model {

Attention::Attention(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config,
                     TensorParallel tp)
    : tp_(tp),
      local_heads_(config.num_attention_heads / tp.size),
      local_kv_heads_(config.num_key_value_heads / tp.size),
      head_dim_(config.head_dim) {
  const int64_t h = config.hidden_size, d = config.head_dim;
  q_proj_ = Linear(params, prefix + "q_proj.weight", h, config.num_attention_heads * d, LinearKind::Column, tp);
  k_proj_ = Linear(params, prefix + "k_proj.weight", h, config.num_key_value_heads * d, LinearKind::Column, tp);
  v_proj_ = Linear(params, prefix + "v_proj.weight", h, config.num_key_value_heads * d, LinearKind::Column, tp);
  o_proj_ = Linear(params, prefix + "o_proj.weight", config.num_attention_heads * d, h, LinearKind::Row, tp);
}

at::Tensor Attention::core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const bool grouped = q.size(1) != k.size(1);
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/grouped);
}

at::Tensor Attention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              bool recompute_core) const {
  const int64_t b = x.size(0), t = x.size(1);
  const at::Tensor in = tp_input(x, tp_);  // one f for the three column-parallel projections
  at::Tensor q = q_proj_.forward(in).view({b, t, local_heads_, head_dim_}).transpose(1, 2);
  at::Tensor k = k_proj_.forward(in).view({b, t, local_kv_heads_, head_dim_}).transpose(1, 2);
  at::Tensor v = v_proj_.forward(in).view({b, t, local_kv_heads_, head_dim_}).transpose(1, 2);
  q = Rotary::apply(q, cos, sin);
  k = Rotary::apply(k, cos, sin);
  at::Tensor out;
  if (recompute_core) {
    out = recompute([](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{core(in[0], in[1], in[2])}; },
                    {q, k, v})[0];
  } else {
    out = core(q, k, v);
  }
  return o_proj_.forward(out.transpose(1, 2).reshape({b, t, local_heads_ * head_dim_}));
}

}  // namespace trainer::model
