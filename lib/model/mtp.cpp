#include "model/mtp.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <vector>

#include "model/transformer.h"  // kIgnoreIndex

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

at::Tensor mtp_ahead(const at::Tensor& inputs, const at::Tensor& targets, int64_t depth, const at::Tensor& documents) {
  const int64_t t = inputs.size(1);
  // The whole sequence: the inputs and the last target (an ignored one reads as token 0; no
  // position predicts from it).
  const at::Tensor sequence = at::cat({inputs, targets.narrow(1, t - 1, 1).clamp_min(0)}, 1);
  std::vector<at::Tensor> tokens, module_targets;
  for (int64_t k = 1; k <= depth; ++k) {
    tokens.push_back(at::constant_pad_nd(sequence.narrow(1, k, t + 1 - k), {0, k - 1}, 0));
    at::Tensor ahead = targets.narrow(1, k, t - k);
    if (documents.defined())  // target i + k is token i + k + 1
      ahead = ahead.masked_fill(documents.narrow(1, k + 1, t - k) != documents.narrow(1, 0, t - k), kIgnoreIndex);
    module_targets.push_back(at::constant_pad_nd(ahead, {0, k}, double(kIgnoreIndex)));
  }
  return at::stack({at::stack(tokens), at::stack(module_targets)});
}

std::pair<at::Tensor, at::Tensor> MtpModule::forward(const at::Tensor& h, const at::Tensor& next,
                                                     const SequenceContext& seq, bool recompute_attention_core,
                                                     bool lean) const {
  const at::Tensor joined = at::cat({enorm_.forward(next, lean), hnorm_.forward(h, lean)}, -1);
  return block_.forward(eh_proj_.forward(joined), seq, recompute_attention_core, lean);
}

}  // namespace trainer::model
