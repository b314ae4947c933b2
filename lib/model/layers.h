#pragma once
// The building blocks of the decoder, each owning its parameters in a ParameterSet by global name.
// Linear and Embedding run on the custom autograd functions of model/linear_function.h (deferred
// weight gradients, gathered weights, fp32 gradient accumulation). Tensor parallelism (Megatron,
// model/parallel_linear.h): a column-parallel linear holds a slice of the output features and
// takes its input replicated (or, with sequence parallelism, as this rank's sequence chunk, which
// it gathers); linears that read the same input run together (forward_together) so that the input
// crosses the tp boundary once; a row-parallel linear holds a slice of the input features and sums
// its output over the tp group (all-reduce, or reduce-scatter along the sequence with sequence
// parallelism). The embedding is split by vocabulary. Activations are [s, b, h]. A layer with a
// tensor-parallel size above one but no group refuses to run.
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/parameter.h"
#include "model/recompute.h"
#include "model/weight_grad_queue.h"

namespace trainer::model {

// The tensor-parallel position of this rank: size 1 on a single process. `group` carries the
// collectives (required when size > 1). With `sequence_parallel` (and size > 1) the activations
// outside the column/row-parallel regions (norms, residuals) hold this rank's 1/size of the
// sequence.
struct TensorParallel {
  int64_t rank = 0;
  int64_t size = 1;
  comm::Communicator* group = nullptr;
  bool sequence_parallel = false;
  // With sp: the linears' gathers and reduce-scatters as collective matmuls (TpComm::comm_overlap).
  bool comm_overlap = true;
  bool sp() const { return sequence_parallel && size > 1; }
};

// This rank's place in the context-parallel group: its part of every sequence is the zigzag
// split's (parallel/context/zigzag.h), and attention runs over the group.
struct ContextParallel {
  enum class Method { Ring, Ulysses };
  int64_t rank = 0;
  int64_t size = 1;
  comm::Communicator* group = nullptr;
  Method method = Method::Ring;
};

// This rank's place inside an expert's tensor-parallel group (etp): each expert's intermediate
// width is split over these ranks (model/grouped_experts.h).
struct ExpertTensorParallel {
  int64_t rank = 0;
  int64_t size = 1;
  comm::Communicator* group = nullptr;
};

// This rank's place in the expert-parallel group: it holds experts [rank * E / size, (rank + 1) *
// E / size) of every MoE layer, and tokens travel to their experts' ranks by all-to-all.
struct ExpertParallel {
  int64_t rank = 0;
  int64_t size = 1;
  comm::Communicator* group = nullptr;
  // The ranks holding the other parts of this rank's micro-batch (tp under sequence parallelism x
  // cp): routing statistics and the capacity rule are taken over them. Null: this rank alone.
  comm::Communicator* sequence_group = nullptr;
  // The ranks whose micro-batches are in flight at the same time (tp x dp x cp): the global-batch
  // load-balancing scope counts over them. Null: this rank alone.
  comm::Communicator* batch_group = nullptr;
  // Expert tensor parallelism inside each expert.
  ExpertTensorParallel etp;
};

// A linear's input that is not saved for backward but computed again there: a norm's output from
// the norm's own saved input (recompute policy `selective`). Empty: the input is saved.
using InputAgain = std::function<at::Tensor()>;

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
  // The column-parallel LM head over a vocabulary padded to `padded_vocab` rows (model::vocab_shards).
  static Linear lm_head(ParameterSet& params, const std::string& name, int64_t hidden, int64_t vocab,
                        int64_t padded_vocab, TensorParallel tp);
  // A linear over an existing parameter (the LM head tied to the embedding); it counts one more use.
  Linear(ParameterSet& params, Parameter& shared, TensorParallel tp);
  at::Tensor forward(const at::Tensor& x) const;
  // forward(silu(gate) * up) saving gate and up instead of the product (model/parallel_linear.h's
  // swiglu_down_linear); a whole or row-parallel linear.
  // fused: the product by kernels/swiglu where the tensors allow (model/fused_kernels.h).
  at::Tensor forward_swiglu(const at::Tensor& gate, const at::Tensor& up, bool fused = false) const;
  // forward(f(inputs)) keeping neither f's output nor its activations: f runs again in backward
  // (model/parallel_linear.h's recomputed_linear); a whole or row-parallel linear.
  at::Tensor forward_recomputed(TensorFunction f, const std::vector<at::Tensor>& inputs) const;
  // This rank's part alone, with no tp communication: x W^T for the local weight (a column-parallel
  // linear's output features of this rank) whose input is already replicated over tp and whose
  // input gradient, a partial sum, is summed over tp further back (MLA's q_b_proj and kv_b_proj,
  // after the replicated latents).
  at::Tensor forward_local(const at::Tensor& x) const;
  // Column-parallel linears over one input, with one tp communication for all of them. Replicated
  // linears may join them (MLA's latent down-projections): their weights' gradients are then
  // partial sums over tp (Parameter::grad_group says so), as their outputs feed this rank's heads only.
  static std::vector<at::Tensor> forward_together(const at::Tensor& x, const std::vector<const Linear*>& linears,
                                                  const InputAgain& again = {});
  const at::Tensor& weight() const { return param_->tensor; }
  Parameter& parameter() const { return *param_; }
  // Where its deferred weight gradients go (the LM head's chunked loss uses it too).
  WeightGradQueue* queue() const { return queue_; }

 private:
  Parameter* param_ = nullptr;
  WeightGradQueue* queue_ = nullptr;
  LinearKind kind_ = LinearKind::Replicated;
  TensorParallel tp_;
};

// The rows of a vocabulary of `vocab` ids padded to `padded_vocab` (a multiple of tp) that this tp
// rank holds: equal pieces, the real rows first (none on a rank past the vocabulary), then zero
// padding. No shard at all when nothing is split or padded.
std::vector<ShardSpec> vocab_shards(int64_t vocab, int64_t padded_vocab, const TensorParallel& tp);

// Token embedding [vocab, hidden]; vocabulary-parallel when tp > 1 (rows split across ranks), its
// output summed over tp (reduce-scattered along the sequence with sequence parallelism). Padding
// rows (vocab_shards) are never looked up.
class Embedding {
 public:
  Embedding() = default;
  Embedding(ParameterSet& params, const std::string& name, int64_t vocab, int64_t padded_vocab, int64_t hidden,
            TensorParallel tp);
  // A lookup in an existing parameter (multi-token prediction's); it counts one more use.
  Embedding(ParameterSet& params, Parameter& shared, TensorParallel tp);
  at::Tensor forward(const at::Tensor& tokens) const;
  Parameter& parameter() const { return *param_; }

 private:
  Parameter* param_ = nullptr;
  WeightGradQueue* queue_ = nullptr;
  TensorParallel tp_;
};

// RMSNorm computed in fp32 and cast back (Hugging Face Llama): w * (x / sqrt(mean(x^2) + eps)).
// Under sequence parallelism each tp rank normalises its own tokens, so the weight's gradient is
// a partial sum that is also reduced over tp.
class RmsNorm {
 public:
  RmsNorm() = default;
  // fused: ATen's fused RMSNorm on CUDA (model/fused_kernels.h).
  RmsNorm(ParameterSet& params, const std::string& name, int64_t hidden, double eps, const TensorParallel& tp = {},
          bool fused = false);
  // `lean` (recompute policy selective): one function saving x and an rsqrt per row
  // (model/rms_norm.h), the normalised values recomputed in backward; otherwise autograd's graph,
  // which keeps an fp32 copy of x (bf16) and the normalised values but recomputes nothing.
  at::Tensor forward(const at::Tensor& x, bool lean = false) const;
  // forward(x, true) again, without autograd: for the linears that read this norm's output to
  // compute it in backward instead of saving it (the same values bit for bit).
  InputAgain again(const at::Tensor& x) const;

 private:
  at::Tensor weight_;
  double eps_ = 1e-6;
  bool fused_ = false;
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)); Hugging Face names gate_proj/up_proj/down_proj, or
// Mixtral's expert names w1/w3/w2 when `mixtral_names`.
class SwigluMlp {
 public:
  SwigluMlp() = default;
  // fused: the activation product by kernels/swiglu on CUDA (model/fused_kernels.h).
  SwigluMlp(ParameterSet& params, const std::string& prefix, int64_t hidden, int64_t intermediate, TensorParallel tp,
            bool mixtral_names = false, bool fused = false);
  // `again`: x computed again in backward instead of saved by gate and up. `lean` (recompute
  // policy selective): the down projection saves gate and up only and recomputes their product in
  // backward; otherwise silu(gate), the product and both are kept (nothing recomputed).
  at::Tensor forward(const at::Tensor& x, const InputAgain& again = {}, bool lean = false) const;

 private:
  Linear gate_, up_, down_;
  TensorParallel tp_;
  bool fused_ = false;
};

}  // namespace trainer::model
