#include "model/decoder_layer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "model/aux_loss_scaler.h"

namespace trainer::model {

DecoderLayer::DecoderLayer(ParameterSet& params, int64_t index, const recipe::ModelConfig& config, TensorParallel tp,
                           ContextParallel cp, ExpertParallel ep, double aux_loss_scale, double z_loss_scale,
                           const FusedKernels& kernels)
    : aux_loss_scale_(aux_loss_scale), z_loss_scale_(z_loss_scale) {
  const std::string prefix = fmt::format("model.layers.{}.", index);
  input_norm_ = RmsNorm(params, prefix + "input_layernorm.weight", config.hidden_size, config.rms_norm_eps, tp,
                        kernels.rms_norm);
  if (config.mla)
    mla_.emplace(params, prefix + "self_attn.", config, tp, cp);
  else
    attention_ = Attention(params, prefix + "self_attn.", config, tp, cp, kernels.rope, config.window_of(index));
  post_attention_norm_ = RmsNorm(params, prefix + "post_attention_layernorm.weight", config.hidden_size,
                                 config.rms_norm_eps, tp, kernels.rms_norm);
  if (config.is_moe_layer(index))
    moe_.emplace(params, prefix + "block_sparse_moe.", config, tp, ep, GroupedGemm::Auto, kernels.swiglu);
  else
    mlp_.emplace(params, prefix + "mlp.", config.hidden_size, config.intermediate_size, tp, /*mixtral_names=*/false,
                 kernels.swiglu);
}

std::pair<at::Tensor, at::Tensor> DecoderLayer::forward(const at::Tensor& x, const SequenceContext& seq,
                                                        bool recompute_attention_core, bool lean) const {
  // Lean (recompute policy selective): the norms save only their input and an rsqrt per row, the
  // linears after each norm compute its output again in backward instead of saving it, and the
  // MLP recomputes its activation product.
  const at::Tensor normed_input = input_norm_.forward(x, lean);
  const InputAgain again = lean ? input_norm_.again(x) : InputAgain();
  const at::Tensor h = x + (mla_ ? mla_->forward(normed_input, seq, recompute_attention_core, again)
                                 : attention_.forward(normed_input, seq, recompute_attention_core, again));
  const at::Tensor normed = post_attention_norm_.forward(h, lean);
  if (moe_) {
    MoeOutput out = moe_->forward(normed, seq.token_keys);
    const at::Tensor y = attach_aux_loss(attach_aux_loss(h + out.output, out.aux_loss, aux_loss_scale_), out.z_loss,
                                         z_loss_scale_);
    return {y, out.aux_loss};
  }
  return {h + mlp_->forward(normed, lean ? post_attention_norm_.again(h) : InputAgain(), lean), at::Tensor()};
}

}  // namespace trainer::model
