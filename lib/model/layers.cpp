#include "model/layers.h"

#include <ATen/ATen.h>

namespace trainer::model {

Linear::Linear(ParameterSet& params, const std::string& name, int64_t in_features, int64_t out_features,
               LinearKind kind, TensorParallel tp)
    : kind_(kind), tp_(tp) {
  ShardSpec shard;
  if (kind == LinearKind::Column) shard = {0, tp.rank, tp.size};
  if (kind == LinearKind::Row) shard = {1, tp.rank, tp.size};
  weight_ = params.create(name, {out_features, in_features}, InitKind::Normal, shard);
}

at::Tensor Linear::forward(const at::Tensor& x) const {
  // Column: the input's gradient is summed over tp ranks in backward (f); row: the output is
  // summed over tp ranks in forward (g). Both are the identity for tp size 1.
  return at::linear(x, weight_);
}

Embedding::Embedding(ParameterSet& params, const std::string& name, int64_t vocab, int64_t hidden, TensorParallel tp)
    : tp_(tp) {
  weight_ = params.create(name, {vocab, hidden}, InitKind::Normal, ShardSpec{0, tp.rank, tp.size});
}

at::Tensor Embedding::forward(const at::Tensor& tokens) const {
  // Vocabulary-parallel lookup (mask tokens outside this rank's rows, then sum over tp) is the
  // plain lookup for tp size 1.
  return at::embedding(weight_, tokens);
}

RmsNorm::RmsNorm(ParameterSet& params, const std::string& name, int64_t hidden, double eps) : eps_(eps) {
  weight_ = params.create(name, {hidden}, InitKind::Ones, ShardSpec{}, /*weight_decay=*/false);
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
