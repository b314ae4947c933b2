#pragma once
// The building blocks of the decoder, each owning its parameters in a ParameterSet by global name.
// Linear and Embedding run on the custom autograd functions of model/linear_function.h (deferred
// weight gradients, gathered weights, fp32 gradient accumulation). Tensor parallelism (Megatron):
// a column-parallel linear holds a slice of the output features and expects its input to have
// passed through tp_input() (the f operator: identity forward, all-reduce backward; blocks apply it
// once for all their column-parallel linears); a row-parallel linear holds a slice of the input
// features and sums its output over the tp group (g). The embedding is split by vocabulary. A
// layer with a tensor-parallel size above one but no group refuses to run.
#include <ATen/core/Tensor.h>

#include <string>

#include "comm/communicator.h"
#include "model/parameter.h"
#include "model/weight_grad_queue.h"

namespace trainer::model {

// The tensor-parallel position of this rank: size 1 on a single process. `group` carries the
// collectives (required when size > 1).
struct TensorParallel {
  int64_t rank = 0;
  int64_t size = 1;
  comm::Communicator* group = nullptr;
};

// The f operator in front of column-parallel linears: x itself for tp size 1.
at::Tensor tp_input(const at::Tensor& x, const TensorParallel& tp);

enum class LinearKind {
  Replicated,  // full weight on every rank
  Column,      // output features split across tp ranks (q/k/v, gate/up, LM head)
  Row,         // input features split across tp ranks (o_proj, down_proj); the output needs a sum
};

// y = x W^T with W of global shape [out_features, in_features] (Hugging Face layout), no bias.
class Linear {
 public:
  Linear() = default;
  Linear(ParameterSet& params, const std::string& name, int64_t in_features, int64_t out_features, LinearKind kind,
         TensorParallel tp);
  // A linear over an existing parameter (the LM head tied to the embedding); it counts one more use.
  Linear(ParameterSet& params, Parameter& shared, TensorParallel tp);
  at::Tensor forward(const at::Tensor& x) const;
  const at::Tensor& weight() const { return param_->tensor; }

 private:
  Parameter* param_ = nullptr;
  WeightGradQueue* queue_ = nullptr;
  LinearKind kind_ = LinearKind::Replicated;
  TensorParallel tp_;
};

// Token embedding [vocab, hidden]; vocabulary-parallel when tp > 1 (rows split across ranks).
class Embedding {
 public:
  Embedding() = default;
  Embedding(ParameterSet& params, const std::string& name, int64_t vocab, int64_t hidden, TensorParallel tp);
  at::Tensor forward(const at::Tensor& tokens) const;
  Parameter& parameter() const { return *param_; }

 private:
  Parameter* param_ = nullptr;
  WeightGradQueue* queue_ = nullptr;
  TensorParallel tp_;
};

// RMSNorm computed in fp32 and cast back (Hugging Face Llama): w * (x / sqrt(mean(x^2) + eps)).
class RmsNorm {
 public:
  RmsNorm() = default;
  RmsNorm(ParameterSet& params, const std::string& name, int64_t hidden, double eps);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  at::Tensor weight_;
  double eps_ = 1e-6;
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)); Hugging Face names gate_proj/up_proj/down_proj, or
// Mixtral's expert names w1/w3/w2 when `mixtral_names`.
class SwigluMlp {
 public:
  SwigluMlp() = default;
  SwigluMlp(ParameterSet& params, const std::string& prefix, int64_t hidden, int64_t intermediate, TensorParallel tp,
            bool mixtral_names = false);
  at::Tensor forward(const at::Tensor& x) const;

 private:
  Linear gate_, up_, down_;
  TensorParallel tp_;
};

}  // namespace trainer::model
