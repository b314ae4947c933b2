#pragma once
// Model parameters by global (Hugging Face) name. A rank holds a slice of each global tensor
// (DESIGN.md invariants 1 and 4): the slice is described by ShardSpec, and its initial values are
// the corresponding part of a global tensor that depends only on (seed, name, global shape).
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <deque>
#include <string>
#include <vector>

namespace trainer::model {

// Which part of the global tensor a rank holds: equal slices along `dim` (-1: the whole tensor).
struct ShardSpec {
  int64_t dim = -1;
  int64_t rank = 0;
  int64_t size = 1;
};

enum class InitKind { Normal, Ones, Zeros };

struct Parameter {
  std::string name;                   // global name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> global_shape;
  ShardSpec shard;
  at::Tensor tensor;                  // the local slice: a leaf that requires grad, in the model dtype
  bool weight_decay = true;           // false for norms (and biases)

  // Offsets of the local slice in the global tensor, one per dimension.
  std::vector<int64_t> offsets() const;
};

struct ParameterOptions {
  uint64_t seed = 0;
  double init_std = 0.02;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

class ParameterSet {
 public:
  explicit ParameterSet(ParameterOptions options) : options_(options) {}

  // Creates, initialises and registers a parameter; returns its local tensor. Names are unique.
  at::Tensor create(const std::string& name, std::vector<int64_t> global_shape, InitKind init, ShardSpec shard = {},
                    bool weight_decay = true);

  std::deque<Parameter>& all() { return parameters_; }
  const std::deque<Parameter>& all() const { return parameters_; }
  const Parameter* find(const std::string& name) const;
  const ParameterOptions& options() const { return options_; }
  int64_t local_numel() const;

 private:
  ParameterOptions options_;
  std::deque<Parameter> parameters_;  // deque: references stay valid as parameters are added
};

// The global initial value of a parameter: fp32 on CPU, a function of (seed, name, shape) only.
at::Tensor global_initial_value(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                                InitKind init, double std);

}  // namespace trainer::model
