#include "model/layers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/linear_function.h"
#include "parallel/tensor/communication.h"

namespace trainer::model {

namespace {

std::vector<ShardSpec> tp_shards(int64_t dim, int64_t extent, TensorParallel tp) {
  if (tp.size == 1) return {};
  // Balanced: heads and MLP widths divide (validation), a vocabulary need not.
  return {ShardSpec::balanced(dim, extent, tp.rank, tp.size, mesh::GroupKind::Tp)};
}

// Without the group the f/g operators cannot run: refuse instead of a wrong result.
void require_group(const TensorParallel& tp, const std::string& name) {
  if (tp.size > 1 && !tp.group)
    throw std::logic_error(fmt::format("{}: a tensor-parallel layer (tp size {}) cannot run without its tp group: "
                                       "without the communication the result would be wrong",
                                       name, tp.size));
}

}  // namespace

at::Tensor tp_input(const at::Tensor& x, const TensorParallel& tp) {
  if (tp.size == 1) return x;
  require_group(tp, "tp_input");
  return parallel::copy_to_tp(x, *tp.group);
}

Linear::Linear(ParameterSet& params, const std::string& name, int64_t in_features, int64_t out_features,
               LinearKind kind, TensorParallel tp)
    : queue_(&params.weight_grads()), kind_(kind), tp_(tp) {
  std::vector<ShardSpec> shards;
  if (kind == LinearKind::Column) shards = tp_shards(0, out_features, tp);
  if (kind == LinearKind::Row) shards = tp_shards(1, in_features, tp);
  param_ = &params.create(name, {out_features, in_features}, InitKind::Normal, std::move(shards));
}

Linear::Linear(ParameterSet& params, Parameter& shared, TensorParallel tp)
    : param_(&shared), queue_(&params.weight_grads()), kind_(LinearKind::Column), tp_(tp) {
  shared.uses += 1;
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  // Column: the input's gradient is summed over tp ranks in backward (f); row: the output is
  // summed over tp ranks in forward (g). Both are the identity for tp size 1.
  if (kind_ != LinearKind::Replicated) require_group(tp_, param_->name);
  const at::Tensor y = linear(x, *param_, queue_);
  return kind_ == LinearKind::Row && tp_.size > 1 ? parallel::reduce_from_tp(y, *tp_.group) : y;
}

Embedding::Embedding(ParameterSet& params, const std::string& name, int64_t vocab, int64_t hidden, TensorParallel tp)
    : queue_(&params.weight_grads()), tp_(tp) {
  param_ = &params.create(name, {vocab, hidden}, InitKind::Normal, tp_shards(0, vocab, tp));
}

at::Tensor Embedding::forward(const at::Tensor& tokens) const {
  // Vocabulary-parallel lookup (mask tokens outside this rank's rows, then sum over tp) is the
  // plain lookup for tp size 1.
  if (tp_.size == 1) return embedding(tokens, *param_, queue_);
  require_group(tp_, param_->name);
  // This rank's rows [begin, begin + rows): other ids look up row 0 and are zeroed, then the
  // ranks' partial results are summed.
  const ShardSpec& rows = param_->shards.at(0);
  const at::Tensor local = tokens - rows.offset;
  const at::Tensor outside = (local < 0) | (local >= rows.length);
  const at::Tensor looked_up = embedding(local.masked_fill(outside, 0), *param_, queue_);
  return parallel::reduce_from_tp(looked_up.masked_fill(outside.unsqueeze(-1), 0), *tp_.group);
}

RmsNorm::RmsNorm(ParameterSet& params, const std::string& name, int64_t hidden, double eps) : eps_(eps) {
  weight_ = params.create(name, {hidden}, InitKind::Ones, {}, /*weight_decay=*/false).tensor;
}

at::Tensor RmsNorm::forward(const at::Tensor& x) const {
  // At least fp32 (bf16 inputs are upcast as in Hugging Face; fp64 stays fp64 for gradient checks).
  const at::Tensor x32 = x.to(at::promote_types(x.scalar_type(), at::kFloat));
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight_ * normed.to(x.scalar_type());
}

SwigluMlp::SwigluMlp(ParameterSet& params, const std::string& prefix, int64_t hidden, int64_t intermediate,
                     TensorParallel tp, bool mixtral_names)
    : tp_(tp) {
  gate_ = Linear(params, prefix + (mixtral_names ? "w1.weight" : "gate_proj.weight"), hidden, intermediate,
                 LinearKind::Column, tp);
  up_ = Linear(params, prefix + (mixtral_names ? "w3.weight" : "up_proj.weight"), hidden, intermediate,
               LinearKind::Column, tp);
  down_ = Linear(params, prefix + (mixtral_names ? "w2.weight" : "down_proj.weight"), intermediate, hidden,
                 LinearKind::Row, tp);
}

at::Tensor SwigluMlp::forward(const at::Tensor& x) const {
  const at::Tensor in = tp_input(x, tp_);
  return down_.forward(at::silu(gate_.forward(in)) * up_.forward(in));
}

}  // namespace trainer::model
