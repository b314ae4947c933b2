#include "model/mtp.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace trainer::model {

MtpModule::MtpModule(ParameterSet& params, int64_t depth, const recipe::ModelConfig& config, TensorParallel tp,
                     ContextParallel cp, ExpertParallel ep, double aux_loss_scale, double z_loss_scale,
                     const FusedKernels& kernels)
    : block_(params, config.num_hidden_layers + depth - 1, config, tp, cp, ep, aux_loss_scale, z_loss_scale,
             kernels) {
  const std::string prefix = fmt::format("model.layers.{}.", config.num_hidden_layers + depth - 1);
  const int64_t h = config.hidden_size;
  enorm_ = RmsNorm(params, prefix + "enorm.weight", h, config.rms_norm_eps, tp, kernels.rms_norm);
  hnorm_ = RmsNorm(params, prefix + "hnorm.weight", h, config.rms_norm_eps, tp, kernels.rms_norm);
  eh_proj_ = Linear(params, prefix + "eh_proj.weight", 2 * h, h, LinearKind::Replicated, tp);
  if (tp.sp()) params.find(prefix + "eh_proj.weight")->grad_group = mesh::GroupKind::TpDpCp;
  head_norm_ = RmsNorm(params, prefix + "shared_head.norm.weight", h, config.rms_norm_eps, tp, kernels.rms_norm);
}

std::pair<at::Tensor, at::Tensor> MtpModule::forward(const at::Tensor& h, const at::Tensor& next, const at::Tensor& cos,
                                                     const at::Tensor& sin, const at::Tensor& token_keys,
                                                     bool recompute_attention_core, bool lean) const {
  const at::Tensor joined = at::cat({enorm_.forward(next, lean), hnorm_.forward(h, lean)}, -1);
  return block_.forward(eh_proj_.forward(joined), cos, sin, token_keys, recompute_attention_core, lean);
}

}  // namespace trainer::model
