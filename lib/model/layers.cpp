#include "model/layers.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/linear_function.h"
#include "model/parallel_linear.h"
#include "model/fused_kernels.h"
#include "model/fused_ops.h"
#include "model/rms_norm.h"
#include "parallel/tensor/communication.h"

namespace trainer::model {

namespace {

std::vector<ShardSpec> tp_shards(int64_t dim, int64_t extent, TensorParallel tp) {
  if (tp.size == 1) return {};
  return {ShardSpec::even(dim, extent, tp.rank, tp.size, mesh::GroupKind::Tp)};  // validation: tp divides
}

// Without the group the f/g operators cannot run: refuse instead of a wrong result.
void require_group(const TensorParallel& tp, const std::string& name) {
  if (tp.size > 1 && !tp.group)
    throw std::logic_error(fmt::format("{}: a tensor-parallel layer (tp size {}) cannot run without its tp group: "
                                       "without the communication the result would be wrong",
                                       name, tp.size));
}

}  // namespace

Linear::Linear(ParameterSet& params, const std::string& name, int64_t in_features, int64_t out_features,
               LinearKind kind, TensorParallel tp)
    : queue_(&params.weight_grads()), kind_(kind), tp_(tp) {
  std::vector<ShardSpec> shards;
  if (kind == LinearKind::Column) shards = tp_shards(0, out_features, tp);
  if (kind == LinearKind::Row) shards = tp_shards(1, in_features, tp);
  param_ = &params.create(name, {out_features, in_features}, InitKind::Normal, std::move(shards));
  param_->layer_matrix = true;  // a router clears it (moe.cpp); the LM head is made by lm_head()
}

std::vector<ShardSpec> vocab_shards(int64_t vocab, int64_t padded_vocab, const TensorParallel& tp) {
  if (tp.size == 1 && padded_vocab == vocab) return {};
  return {ShardSpec::padded(vocab, padded_vocab, tp.rank, tp.size, mesh::GroupKind::Tp)};
}

Linear Linear::lm_head(ParameterSet& params, const std::string& name, int64_t hidden, int64_t vocab,
                       int64_t padded_vocab, TensorParallel tp) {
  Linear head;
  head.queue_ = &params.weight_grads();
  head.kind_ = LinearKind::Column;
  head.tp_ = tp;
  head.param_ = &params.create(name, {vocab, hidden}, InitKind::Normal, vocab_shards(vocab, padded_vocab, tp));
  return head;
}

Linear::Linear(ParameterSet& params, Parameter& shared, TensorParallel tp)
    : param_(&shared), queue_(&params.weight_grads()), kind_(LinearKind::Column), tp_(tp) {
  shared.uses += 1;
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  if (kind_ == LinearKind::Column) return forward_together(x, {this})[0];
  if (kind_ == LinearKind::Replicated || tp_.size == 1) return linear(x, *param_, queue_);
  require_group(tp_, param_->name);
  return row_parallel_linear(x, *param_, queue_, TpComm{tp_.group, tp_.sp(), tp_.comm_overlap});
}

at::Tensor Linear::forward_swiglu(const at::Tensor& gate, const at::Tensor& up, bool fused) const {
  if (kind_ == LinearKind::Column) throw std::logic_error("forward_swiglu is for a row-parallel or whole linear");
  if (kind_ == LinearKind::Replicated || tp_.size == 1)
    return swiglu_down_linear(gate, up, *param_, queue_, TpComm{}, fused);
  require_group(tp_, param_->name);
  return swiglu_down_linear(gate, up, *param_, queue_, TpComm{tp_.group, tp_.sp(), tp_.comm_overlap}, fused);
}

at::Tensor Linear::forward_recomputed(TensorFunction f, const std::vector<at::Tensor>& inputs) const {
  if (kind_ == LinearKind::Column) throw std::logic_error("forward_recomputed is for a row-parallel or whole linear");
  if (kind_ == LinearKind::Replicated || tp_.size == 1)
    return recomputed_linear(std::move(f), inputs, *param_, queue_, TpComm{});
  require_group(tp_, param_->name);
  return recomputed_linear(std::move(f), inputs, *param_, queue_, TpComm{tp_.group, tp_.sp(), tp_.comm_overlap});
}

at::Tensor Linear::forward_local(const at::Tensor& x) const { return linear(x, *param_, queue_); }

std::vector<at::Tensor> Linear::forward_together(const at::Tensor& x, const std::vector<const Linear*>& linears,
                                                 const InputAgain& again) {
  const Linear& first = *linears.front();
  if (first.tp_.size == 1) {
    std::vector<at::Tensor> out;
    for (const Linear* l : linears) out.push_back(linear(x, *l->param_, l->queue_, again));
    return out;
  }
  std::vector<Parameter*> params;
  for (const Linear* l : linears) {
    if (l->kind_ == LinearKind::Row)
      throw std::logic_error(l->param_->name + ": a row-parallel linear cannot share a column-parallel input");
    if (l->kind_ == LinearKind::Replicated && l->param_->grad_group != mesh::GroupKind::TpDpCp)
      throw std::logic_error(l->param_->name + ": a replicated linear in a tensor-parallel region needs its "
                             "gradient summed over tp (grad_group TpDpCp)");
    params.push_back(l->param_);
  }
  require_group(first.tp_, first.param_->name);
  return column_parallel_linear(x, params, first.queue_, TpComm{first.tp_.group, first.tp_.sp(), first.tp_.comm_overlap}, again);
}

Embedding::Embedding(ParameterSet& params, const std::string& name, int64_t vocab, int64_t padded_vocab,
                     int64_t hidden, TensorParallel tp)
    : queue_(&params.weight_grads()), tp_(tp) {
  param_ = &params.create(name, {vocab, hidden}, InitKind::Normal, vocab_shards(vocab, padded_vocab, tp));
}

Embedding::Embedding(ParameterSet& params, Parameter& shared, TensorParallel tp)
    : param_(&shared), queue_(&params.weight_grads()), tp_(tp) {
  shared.uses += 1;
}

at::Tensor Embedding::forward(const at::Tensor& tokens) const {
  // Vocabulary-parallel lookup (mask tokens outside this rank's rows, then sum over tp) is the
  // plain lookup for tp size 1.
  if (tp_.size == 1) return embedding(tokens, *param_, queue_);
  require_group(tp_, param_->name);
  // This rank's real rows [offset, offset + length) (none past the vocabulary): other ids look up
  // row 0 and are zeroed, then the ranks' partial results are summed.
  const ShardSpec& rows = param_->shards.at(0);
  const at::Tensor local = tokens - rows.offset;
  const at::Tensor outside = (local < 0) | (local >= rows.length);
  const at::Tensor looked_up = embedding(local.masked_fill(outside, 0), *param_, queue_);
  const at::Tensor partial = looked_up.masked_fill(outside.unsqueeze(-1), 0);
  return tp_.sp() ? parallel::reduce_scatter_to_sp(partial, *tp_.group) : parallel::reduce_from_tp(partial, *tp_.group);
}

RmsNorm::RmsNorm(ParameterSet& params, const std::string& name, int64_t hidden, double eps, const TensorParallel& tp,
                 bool fused)
    : eps_(eps), fused_(fused) {
  Parameter& p = params.create(name, {hidden}, InitKind::Ones, {}, /*weight_decay=*/false);
  if (tp.sp()) p.grad_group = mesh::GroupKind::TpDpCp;
  weight_ = p.tensor;
}

at::Tensor RmsNorm::forward(const at::Tensor& x, bool lean) const {
  // ATen's fused kernel saves x and the reciprocal root only, lean or not.
  if (fused_ && fusable(x)) return fused::rms_norm(x, weight_, eps_);
  // At least fp32 (bf16 inputs are upcast as in Hugging Face; fp64 stays fp64 for gradient checks).
  if (lean) return rms_norm(x, weight_, eps_);
  // Autograd's graph of the same arithmetic: faster backward on the CPU, more saved.
  const at::Tensor x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight_ * normed.to(x.scalar_type());
}

InputAgain RmsNorm::again(const at::Tensor& x) const {
  // x and the weight are what the norm's own function saves: nothing more is kept.
  return [x = x.detach(), weight = weight_.detach(), eps = eps_, use_fused = fused_ && fusable(x)] {
    at::NoGradGuard no_grad;
    return use_fused ? fused::rms_norm(x, weight, eps) : rms_norm(x, weight, eps);
  };
}

SwigluMlp::SwigluMlp(ParameterSet& params, const std::string& prefix, int64_t hidden, int64_t intermediate,
                     TensorParallel tp, bool mixtral_names, bool fused)
    : tp_(tp), fused_(fused) {
  gate_ = Linear(params, prefix + (mixtral_names ? "w1.weight" : "gate_proj.weight"), hidden, intermediate,
                 LinearKind::Column, tp);
  up_ = Linear(params, prefix + (mixtral_names ? "w3.weight" : "up_proj.weight"), hidden, intermediate,
               LinearKind::Column, tp);
  down_ = Linear(params, prefix + (mixtral_names ? "w2.weight" : "down_proj.weight"), intermediate, hidden,
                 LinearKind::Row, tp);
}

at::Tensor SwigluMlp::forward(const at::Tensor& x, const InputAgain& again, bool lean) const {
  const auto gate_up = Linear::forward_together(x, {&gate_, &up_}, again);
  // Lean: the down projection saves gate and up only and recomputes the product in backward.
  const bool use_fused = fused_ && fusable(gate_up[0]);
  if (lean) return down_.forward_swiglu(gate_up[0], gate_up[1], use_fused);
  return down_.forward(use_fused ? fused::swiglu(gate_up[0], gate_up[1]) : at::silu(gate_up[0]) * gate_up[1]);
}

}  // namespace trainer::model
