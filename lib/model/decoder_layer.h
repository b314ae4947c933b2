#pragma once
// One decoder layer: pre-norm attention (grouped-query, or latent with model.mla) and a pre-norm
// feed-forward (SwiGLU MLP, or MoE where model.moe.layers says), each with its residual.
#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

#include "model/attention.h"
#include "model/fused_kernels.h"
#include "model/layers.h"
#include "model/mla_attention.h"
#include "model/moe.h"
#include "model/parameter.h"
#include "recipe/recipe.h"

namespace trainer::model {

class DecoderLayer {
 public:
  DecoderLayer(ParameterSet& params, int64_t index, const recipe::ModelConfig& config, TensorParallel tp,
               ContextParallel cp, ExpertParallel ep, double aux_loss_scale, double z_loss_scale,
               const FusedKernels& kernels = {});
  // Returns the new hidden state and this layer's load-balancing loss (undefined for dense layers).
  // seq: the micro-batch's rotary tables, MoE token order and document mask. lean (recompute
  // policy selective): norms that save their input only, norm outputs and the MLP's activation
  // product computed again in backward.
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& x, const SequenceContext& seq,
                                            bool recompute_attention_core, bool lean = false) const;
  bool is_moe() const { return moe_.has_value(); }
  const Moe* moe() const { return moe_ ? &*moe_ : nullptr; }
  Moe* moe() { return moe_ ? &*moe_ : nullptr; }

 private:
  RmsNorm input_norm_, post_attention_norm_;
  Attention attention_;                // grouped-query attention, unless
  std::optional<MlaAttention> mla_;    // model.mla: latent attention
  std::optional<SwigluMlp> mlp_;
  std::optional<Moe> moe_;
  double aux_loss_scale_ = 0, z_loss_scale_ = 0;
};

}  // namespace trainer::model
