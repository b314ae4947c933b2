#pragma once
// Model parameters by global (Hugging Face) name. A rank holds a slice of each global tensor
// (DESIGN.md invariants 1, 4 and 8): the slice is described by its ShardSpecs, its initial values
// are the corresponding part of a global tensor that depends only on (seed, name, global shape),
// and it records the group its gradient is summed over.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mesh/rank_layout.h"
#include "model/weight_grad_queue.h"

namespace trainer::model {

// One split of a parameter: along `dim` this rank holds [offset, offset + length) of the global
// extent; the other pieces are on the other ranks of `group` (tp, etp or ep). `padding` zero rows
// follow the real ones in the local tensor (a padded vocabulary; dimension 0 only): they are not
// part of the global tensor, so checkpoints and exports never see them. A rank may hold padding
// only (length 0).
enum class InitKind { Normal, Ones, Zeros };

struct ShardSpec {
  int64_t dim = 0;
  int64_t offset = 0;
  int64_t length = 0;
  mesh::GroupKind group = mesh::GroupKind::Tp;
  int64_t padding = 0;

  // Piece `rank` of `size` equal pieces of a global extent that `size` must divide.
  static ShardSpec even(int64_t dim, int64_t extent, int64_t rank, int64_t size, mesh::GroupKind group);
  // Piece `rank` of `size` equal pieces of `padded_extent` (a multiple of `size`, at least
  // `extent`) along dimension 0, of which only the first `extent` rows are real (Megatron's padded
  // vocabulary): the real rows of this piece, then its padding.
  static ShardSpec padded(int64_t extent, int64_t padded_extent, int64_t rank, int64_t size, mesh::GroupKind group);
};

struct Parameter {
  std::string name;                   // global name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> global_shape;
  std::vector<ShardSpec> shards;      // empty: this rank holds the whole tensor
  at::Tensor tensor;                  // the local slice: a leaf that requires grad, in the model dtype
  bool weight_decay = true;           // false for norms (and biases)
  InitKind init = InitKind::Normal;   // how its initial value is drawn (ParameterSet::initial_value)
  // The ranks its gradient is summed over: dp x cp for dense weights, edp for experts (tp x dp x
  // cp for sequence-parallel norm weights).
  mesh::GroupKind grad_group = mesh::GroupKind::DpCp;
  int64_t chunk = 0;                  // the model chunk that uses it (pipeline stages hold chunks)
  // The forward unit that first uses it, in model order: 0 the embedding, 1 + i decoder layer i,
  // num_hidden_layers + 1 the final norm and LM head (ParameterSet::before_forward).
  int64_t unit = 0;
  int64_t uses = 1;                   // gradient contributions per micro-batch (2: a tied embedding)
  // A tied embedding split across the pipeline: the first stage's embedding and the last stage's
  // LM head are copies of one weight; their gradients are summed and their holders counted over
  // the embedding group (Megatron's word_embeddings_for_head).
  bool tied_across_stages = false;
  // An expert's weight under expert parallelism: only the ranks at this rank's position in the ep
  // group (its edp group, times the other stages' ranks) hold it; the other ep ranks hold other
  // experts.
  bool expert = false;
  // A weight matrix of a layer's linear map (attention, feed-forward, each expert's, MTP's
  // projection; not the embedding, the LM head or a router): Muon orthogonalises its update as a
  // whole matrix (optim/muon_rule.h).
  bool layer_matrix = false;

  // Where the gradient goes. Without gradient buffers: tensor.grad(), as autograd would. With
  // them (engine::GradBuckets installs both): main_grad is this parameter's view of its bucket
  // (fp32 for bf16 parameters by default); every contribution is added into it and then
  // grad_ready() is called, so the bucket knows when its last gradient of the step has arrived.
  at::Tensor main_grad;
  // Weight-gradient GEMMs write into an fp32 main_grad directly (FusedKernels::grad_accumulation).
  bool fused_grad_accumulation = false;
  std::function<void()> grad_ready;
  // ZeRO-2: the bucket's buffer exists only while it accumulates; call grad_buffer() (when set)
  // before adding a contribution to main_grad, which it makes a view of a live buffer.
  std::function<void()> grad_buffer;
  // ZeRO-3: when set, layers take the full weight from gather() just before each use (forward, and
  // again in backward) and call release() after it, instead of holding `tensor`.
  std::function<at::Tensor()> gather;
  std::function<void()> release;

  // Offsets of the local slice in the global tensor, one per dimension.
  std::vector<int64_t> offsets() const;
  // The local slice without padding rows (what checkpoints hold): its sizes, and the part of a
  // tensor of the local shape (the parameter, its gradient or an optimizer state) they cover. The
  // real elements are a prefix of the local tensor in row-major order.
  std::vector<int64_t> real_sizes() const;
  int64_t real_numel() const;
  at::Tensor real_part(const at::Tensor& local) const;
  // The gradient as the optimizer reads it: main_grad when installed, else tensor.grad().
  at::Tensor grad() const { return main_grad.defined() ? main_grad : tensor.grad(); }
};

// Adds one gradient contribution of `p` (the shape of its local slice): into main_grad and
// grad_ready() when buffers are installed, otherwise into tensor.grad() (set on the first one).
void accumulate_gradient(Parameter& p, const at::Tensor& grad);

// accumulate_gradient(p, a.mm(b)), with the product accumulated into an fp32 main_grad by the GEMM
// itself when p.fused_grad_accumulation and a, b are bf16 on CUDA (model/fused_kernels.h).
void accumulate_gradient_mm(Parameter& p, const at::Tensor& a, const at::Tensor& b);

// What happens at the boundaries of forward units (ParameterSet::set_unit_hooks).
struct UnitHooks {
  std::function<void(int64_t unit)> before_forward, after_forward, before_backward;
};

struct ParameterOptions {
  uint64_t seed = 0;
  double init_std = 0.02;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // Parameters get their shape but no memory (model/tensor_storage.h): whoever places them (ZeRO-3's
  // buckets) writes initial_value() into their final storage, so the whole model never exists at
  // once on a rank.
  bool deferred = false;
};

class ParameterSet {
 public:
  explicit ParameterSet(ParameterOptions options)
      : options_(options), weight_grads_(std::make_shared<WeightGradQueue>()) {}

  // Creates, initialises and registers a parameter; returns it. Names are unique; shards must lie
  // inside the global shape.
  Parameter& create(const std::string& name, std::vector<int64_t> global_shape, InitKind init,
                    std::vector<ShardSpec> shards = {}, bool weight_decay = true);

  std::deque<Parameter>& all() { return parameters_; }
  Parameter* find(const std::string& name);
  // The initial value of p's local slice (padding rows zero), in the model's dtype and device.
  at::Tensor initial_value(const Parameter& p) const;
  const std::deque<Parameter>& all() const { return parameters_; }
  const Parameter* find(const std::string& name) const;
  const ParameterOptions& options() const { return options_; }
  int64_t local_numel() const;
  // The model reports where each forward unit (Parameter::unit) begins and ends, in forward and in
  // backward; ZeRO waits there for a unit's parameter gathers (stage 1 and 2: the update's; stage
  // 3: the unit's own, with the next one prefetched) and releases gathered parameters after use.
  // Unset hooks do nothing.
  void set_unit_hooks(UnitHooks hooks) { hooks_ = std::move(hooks); }
  void before_forward(int64_t unit) const {
    if (hooks_.before_forward) hooks_.before_forward(unit);
  }
  void after_forward(int64_t unit) const {
    if (hooks_.after_forward) hooks_.after_forward(unit);
  }
  // Returns the unit's output x with a hook that calls hooks.before_backward(unit) when x's
  // gradient is complete, just before the unit's own backward (nothing when that hook is unset or
  // x needs no gradient). The unit before it in backward order has finished its backward then.
  at::Tensor mark_unit_output(const at::Tensor& x, int64_t unit) const;
  // Where the linears of this model queue deferred weight gradients (zero-bubble's W).
  // Layers keep pointers to it and to the parameters (a deque): both stay put when the set moves.
  WeightGradQueue& weight_grads() { return *weight_grads_; }

 private:
  ParameterOptions options_;
  std::shared_ptr<WeightGradQueue> weight_grads_;
  std::deque<Parameter> parameters_;  // deque: references stay valid as parameters are added
  UnitHooks hooks_;
};

// The global initial value of a parameter: fp32 on CPU, a function of (seed, name, shape) only.
at::Tensor global_initial_value(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                                InitKind init, double std);

}  // namespace trainer::model
