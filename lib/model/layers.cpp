#include "model/layers.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>

#include "model/linear_function.h"

namespace trainer::model {

namespace {

std::vector<ShardSpec> tp_shards(int64_t dim, int64_t extent, TensorParallel tp) {
  if (tp.size == 1) return {};
  return {ShardSpec::even(dim, extent, tp.rank, tp.size, mesh::GroupKind::Tp)};
}

// The f/g operators of tensor parallelism are not written yet: refuse instead of a wrong result.
void refuse_tensor_parallel(const TensorParallel& tp, const std::string& name) {
  if (tp.size > 1)
    throw std::logic_error(fmt::format("{}: tensor-parallel layers (tp size {}) cannot run yet: their communication "
                                       "is not implemented, and without it the result would be wrong",
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
}

Linear::Linear(ParameterSet& params, Parameter& shared, TensorParallel tp)
    : param_(&shared), queue_(&params.weight_grads()), kind_(LinearKind::Column), tp_(tp) {
  shared.uses += 1;
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  // Column: the input's gradient is summed over tp ranks in backward (f); row: the output is
  // summed over tp ranks in forward (g). Both are the identity for tp size 1.
  if (kind_ != LinearKind::Replicated) refuse_tensor_parallel(tp_, param_->name);
  return linear(x, *param_, queue_);
}

Embedding::Embedding(ParameterSet& params, const std::string& name, int64_t vocab, int64_t hidden, TensorParallel tp)
    : queue_(&params.weight_grads()), tp_(tp) {
  param_ = &params.create(name, {vocab, hidden}, InitKind::Normal, tp_shards(0, vocab, tp));
}

at::Tensor Embedding::forward(const at::Tensor& tokens) const {
  // Vocabulary-parallel lookup (mask tokens outside this rank's rows, then sum over tp) is the
  // plain lookup for tp size 1.
  refuse_tensor_parallel(tp_, param_->name);
  return embedding(tokens, *param_, queue_);
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
                     TensorParallel tp, bool mixtral_names) {
  gate_ = Linear(params, prefix + (mixtral_names ? "w1.weight" : "gate_proj.weight"), hidden, intermediate,
                 LinearKind::Column, tp);
  up_ = Linear(params, prefix + (mixtral_names ? "w3.weight" : "up_proj.weight"), hidden, intermediate,
               LinearKind::Column, tp);
  down_ = Linear(params, prefix + (mixtral_names ? "w2.weight" : "down_proj.weight"), intermediate, hidden,
                 LinearKind::Row, tp);
}

at::Tensor SwigluMlp::forward(const at::Tensor& x) const {
  return down_.forward(at::silu(gate_.forward(x)) * up_.forward(x));
}

}  // namespace trainer::model
