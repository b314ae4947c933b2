#include "model/mla_attention.h"

#include <ATen/ATen.h>

#include "model/attention.h"
#include "model/rotary.h"

namespace trainer::model {

namespace {

// DeepseekV3RMSNorm's default: the latent norms do not take model.rms_norm_eps.
constexpr double kLatentNormEps = 1e-6;

// DeepSeek's rotary layout, pairs (x0, x1), (x2, x3), ..., as the two halves [x0, x2, ...; x1, x3,
// ...] that Rotary::apply turns (transformers' apply_rotary_pos_emb_interleave computes the same
// values). Queries and keys are reordered alike, so their dot products are unchanged.
at::Tensor deinterleave(const at::Tensor& x) {
  const int64_t d = x.size(-1);
  auto pairs = x.sizes().vec();
  pairs.back() = d / 2;
  pairs.push_back(2);
  return x.reshape(pairs).transpose(-1, -2).reshape(x.sizes());
}

}  // namespace

MlaAttention::MlaAttention(ParameterSet& params, const std::string& prefix, const recipe::ModelConfig& config,
                           TensorParallel tp, ContextParallel cp)
    : cp_(cp), local_heads_(config.num_attention_heads / tp.size), query_factor_(config.mla_softmax_factor()) {
  const recipe::MlaConfig& mla = *config.mla;
  const int64_t hidden = config.hidden_size, heads = config.num_attention_heads, qk = mla.qk_head_dim();
  kv_lora_rank_ = mla.kv_lora_rank;
  nope_ = mla.qk_nope_head_dim;
  rope_ = mla.qk_rope_head_dim;
  v_dim_ = mla.v_head_dim;
  interleaved_ = mla.rope_interleave;
  q_lora_ = mla.q_lora_rank.has_value();
  // The replicated parts (down-projections, latent norms): partial gradients on each tp rank.
  auto replicated_grads = [&](const std::string& name) {
    if (tp.size > 1) params.find(prefix + name)->grad_group = mesh::GroupKind::TpDpCp;
  };
  if (q_lora_) {
    const int64_t rank = *mla.q_lora_rank;
    q_a_proj_ = Linear(params, prefix + "q_a_proj.weight", hidden, rank, LinearKind::Replicated, tp);
    replicated_grads("q_a_proj.weight");
    q_a_norm_ = RmsNorm(params, prefix + "q_a_layernorm.weight", rank, kLatentNormEps);
    replicated_grads("q_a_layernorm.weight");
    q_b_proj_ = Linear(params, prefix + "q_b_proj.weight", rank, heads * qk, LinearKind::Column, tp);
  } else {
    q_proj_ = Linear(params, prefix + "q_proj.weight", hidden, heads * qk, LinearKind::Column, tp);
  }
  kv_a_proj_ = Linear(params, prefix + "kv_a_proj_with_mqa.weight", hidden, kv_lora_rank_ + rope_,
                      LinearKind::Replicated, tp);
  replicated_grads("kv_a_proj_with_mqa.weight");
  kv_a_norm_ = RmsNorm(params, prefix + "kv_a_layernorm.weight", kv_lora_rank_, kLatentNormEps);
  replicated_grads("kv_a_layernorm.weight");
  kv_b_proj_ = Linear(params, prefix + "kv_b_proj.weight", kv_lora_rank_, heads * (nope_ + v_dim_),
                      LinearKind::Column, tp);
  o_proj_ = Linear(params, prefix + "o_proj.weight", heads * v_dim_, hidden, LinearKind::Row, tp);
}

at::Tensor MlaAttention::forward(const at::Tensor& x, const SequenceContext& seq, bool recompute_core,
                                 const InputAgain& again) const {
  // Everything that reads x in one column-parallel region: one tp communication (the gather of the
  // sequence with sp), one input-gradient reduction.
  const auto down = Linear::forward_together(x, {q_lora_ ? &q_a_proj_ : &q_proj_, &kv_a_proj_}, again);
  const int64_t t = down[0].size(0), b = down[0].size(1), qk = nope_ + rope_;
  // The latent norms as the norm function (saving their input and an rsqrt per row), as the q/k
  // norms of grouped-query attention run.
  const at::Tensor q_all = q_lora_ ? q_b_proj_.forward_local(q_a_norm_.forward(down[0], /*lean=*/true)) : down[0];
  const at::Tensor q = q_all.view({t, b, local_heads_, qk});
  const at::Tensor kv = kv_b_proj_.forward_local(kv_a_norm_.forward(down[1].narrow(-1, 0, kv_lora_rank_), /*lean=*/true))
                            .view({t, b, local_heads_, nope_ + v_dim_});
  at::Tensor q_rot = q.narrow(-1, nope_, rope_);
  at::Tensor k_rot = down[1].narrow(-1, kv_lora_rank_, rope_).reshape({t, b, 1, rope_});
  if (interleaved_) {
    q_rot = deinterleave(q_rot);
    k_rot = deinterleave(k_rot);
  }
  const int64_t rows = seq.cos.dim() == 3 ? b : 1;  // [T, B, d]: positions per sample
  const at::Tensor cos4 = seq.cos.view({t, rows, 1, rope_}), sin4 = seq.sin.view({t, rows, 1, rope_});
  q_rot = Rotary::apply(q_rot, cos4, sin4);
  k_rot = Rotary::apply(k_rot, cos4, sin4);
  at::Tensor query = at::cat({q.narrow(-1, 0, nope_), q_rot}, -1);
  // The core's scale is 1/sqrt(qk); DeepSeek's YaRN multiplies it by mscale^2.
  if (query_factor_ != 1.0) query = query * query_factor_;
  const at::Tensor key = at::cat({kv.narrow(-1, 0, nope_), k_rot.expand({t, b, local_heads_, rope_})}, -1);
  at::Tensor value = kv.narrow(-1, nope_, v_dim_);
  // One head width for the kernels (flash needs it): zeros past v_head_dim, dropped after the core;
  // a value as wide as the queries is copied out of the up-projection's output all the same (one
  // layout for the kernels, and the projection's output is freed).
  value = v_dim_ < qk ? at::constant_pad_nd(value, {0, qk - v_dim_}) : value.contiguous();
  const at::Tensor q4 = query.permute({1, 2, 0, 3}), k4 = key.permute({1, 2, 0, 3}), v4 = value.permute({1, 2, 0, 3});
  auto core_out = [this, t, b, documents = seq.documents](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return attention_core(q, k, v, cp_, /*window=*/0, documents)
        .narrow(-1, 0, v_dim_)
        .permute({2, 0, 1, 3})
        .reshape({t, b, local_heads_ * v_dim_});
  };
  if (recompute_core)
    return o_proj_.forward_recomputed(
        [core_out](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{core_out(in[0], in[1], in[2])}; },
        {q4, k4, v4});
  return o_proj_.forward(core_out(q4, k4, v4));
}

}  // namespace trainer::model
