#include "model/parameter.h"

#include "model/fused_ops.h"
#include "model/tensor_storage.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::model {

namespace {

// A well-mixed 64-bit seed from the run's seed and the parameter's global name.
uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed ^ (h + 0x9e3779b97f4a7c15ull + (seed << 6) + (seed >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64 finaliser
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

ShardSpec ShardSpec::even(int64_t dim, int64_t extent, int64_t rank, int64_t size, mesh::GroupKind group) {
  if (size < 1 || extent % size != 0)
    throw std::logic_error(fmt::format("an extent of {} does not split into {} equal shards", extent, size));
  return ShardSpec{dim, extent / size * rank, extent / size, group};
}

ShardSpec ShardSpec::padded(int64_t extent, int64_t padded_extent, int64_t rank, int64_t size, mesh::GroupKind group) {
  if (size < 1 || padded_extent < extent || padded_extent % size != 0)
    throw std::logic_error(fmt::format("a padded extent of {} (real {}) does not split into {} equal shards",
                                       padded_extent, extent, size));
  const int64_t rows = padded_extent / size, begin = rows * rank;
  const int64_t length = std::clamp<int64_t>(extent - begin, 0, rows);
  return ShardSpec{0, std::min(begin, extent), length, group, rows - length};
}

std::vector<int64_t> Parameter::real_sizes() const {
  std::vector<int64_t> sizes = tensor.sizes().vec();
  for (const auto& s : shards) sizes[size_t(s.dim)] = s.length;
  return sizes;
}

int64_t Parameter::real_numel() const {
  int64_t n = 1;
  for (const int64_t d : real_sizes()) n *= d;
  return n;
}

at::Tensor Parameter::real_part(const at::Tensor& local) const {
  at::Tensor out = local;
  for (const auto& s : shards)
    if (s.padding > 0) out = out.narrow(s.dim, 0, s.length);
  return out;
}

std::vector<int64_t> Parameter::offsets() const {
  std::vector<int64_t> result(global_shape.size(), 0);
  for (const auto& s : shards) result[size_t(s.dim)] = s.offset;
  return result;
}

void accumulate_gradient(Parameter& p, const at::Tensor& grad) {
  if (p.grad_buffer) p.grad_buffer();
  if (p.main_grad.defined()) {
    p.main_grad.add_(grad);
    if (p.grad_ready) p.grad_ready();
    return;
  }
  at::Tensor& current = p.tensor.mutable_grad();
  if (current.defined())
    current.add_(grad);
  else
    current = grad.detach();
}

void accumulate_gradient_mm(Parameter& p, const at::Tensor& a, const at::Tensor& b) {
  // ZeRO-2 makes main_grad a live buffer only in grad_buffer(): ask first, then look.
  if (p.grad_buffer) p.grad_buffer();
  if (p.fused_grad_accumulation && p.main_grad.defined() && p.main_grad.scalar_type() == at::kFloat && a.is_cuda() &&
      a.scalar_type() == at::kBFloat16) {
    fused::add_mm_(p.main_grad, a, b);
    if (p.grad_ready) p.grad_ready();
    return;
  }
  accumulate_gradient(p, a.mm(b));
}

at::Tensor global_initial_value(uint64_t seed, const std::string& name, const std::vector<int64_t>& shape,
                                InitKind init, double std) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  switch (init) {
    case InitKind::Ones: return at::ones(shape, options);
    case InitKind::Zeros: return at::zeros(shape, options);
    case InitKind::Normal: {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, name));
      return at::normal(0.0, std, shape, generator, options);
    }
  }
  throw std::logic_error("unknown InitKind");
}

Parameter& ParameterSet::create(const std::string& name, std::vector<int64_t> global_shape, InitKind init,
                                std::vector<ShardSpec> shards, bool weight_decay) {
  if (find(name)) throw std::logic_error(fmt::format("parameter {} registered twice", name));
  std::vector<int64_t> local_shape = global_shape;
  for (const auto& s : shards) {
    if (s.dim < 0 || s.dim >= int64_t(global_shape.size()) || s.offset < 0 || s.length < (s.padding > 0 ? 0 : 1) ||
        s.offset + s.length > global_shape[size_t(s.dim)] || s.padding < 0 || (s.padding > 0 && s.dim != 0))
      throw std::logic_error(fmt::format("parameter {}: shard [{}, {}) along dimension {} is outside its shape", name,
                                         s.offset, s.offset + s.length, s.dim));
    local_shape[size_t(s.dim)] = s.length + s.padding;
  }
  Parameter p;
  p.name = name;
  p.global_shape = std::move(global_shape);
  p.shards = std::move(shards);
  p.weight_decay = weight_decay;
  p.init = init;
  if (options_.deferred) {
    p.tensor = at::empty(local_shape, at::TensorOptions().dtype(options_.dtype).device(options_.device));
    release_storage(p.tensor);
    p.tensor.requires_grad_(true);
  } else {
    p.tensor = initial_value(p).requires_grad_(true);
  }
  parameters_.push_back(std::move(p));
  return parameters_.back();
}

at::Tensor ParameterSet::initial_value(const Parameter& p) const {
  at::Tensor value = global_initial_value(options_.seed, p.name, p.global_shape, p.init, options_.init_std);
  for (const auto& s : p.shards) {
    value = value.narrow(s.dim, s.offset, s.length);
    if (s.padding > 0) {
      std::vector<int64_t> zeros = value.sizes().vec();
      zeros[size_t(s.dim)] = s.padding;
      value = at::cat({value, at::zeros(zeros, value.options())}, s.dim);
    }
  }
  // A slice along dimension 0 is a contiguous view that would keep the whole global tensor alive:
  // copy it, so a rank holds only its slice.
  if (!p.shards.empty()) value = value.clone(at::MemoryFormat::Contiguous);
  return value.contiguous().to(options_.device, options_.dtype).detach();
}

const Parameter* ParameterSet::find(const std::string& name) const {
  for (const auto& p : parameters_)
    if (p.name == name) return &p;
  return nullptr;
}

Parameter* ParameterSet::find(const std::string& name) {
  for (auto& p : parameters_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t ParameterSet::local_numel() const {
  int64_t n = 0;
  for (const auto& p : parameters_) n += p.tensor.numel();
  return n;
}

}  // namespace trainer::model
