#include "model/parameter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

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

std::vector<int64_t> Parameter::offsets() const {
  std::vector<int64_t> result(global_shape.size(), 0);
  if (shard.dim >= 0) result[shard.dim] = global_shape[shard.dim] / shard.size * shard.rank;
  return result;
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

at::Tensor ParameterSet::create(const std::string& name, std::vector<int64_t> global_shape, InitKind init,
                                ShardSpec shard, bool weight_decay) {
  if (find(name)) throw std::logic_error(fmt::format("parameter {} registered twice", name));
  at::Tensor value = global_initial_value(options_.seed, name, global_shape, init, options_.init_std);
  if (shard.dim >= 0 && shard.size > 1) {
    if (global_shape[shard.dim] % shard.size != 0)
      throw std::logic_error(fmt::format("parameter {}: dimension {} of size {} does not split into {} shards", name,
                                         shard.dim, global_shape[shard.dim], shard.size));
    const int64_t part = global_shape[shard.dim] / shard.size;
    value = value.narrow(shard.dim, part * shard.rank, part).contiguous();
  }
  value = value.to(options_.device, options_.dtype).detach().requires_grad_(true);
  parameters_.push_back(Parameter{name, std::move(global_shape), shard, value, weight_decay});
  return value;
}

const Parameter* ParameterSet::find(const std::string& name) const {
  for (const auto& p : parameters_)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t ParameterSet::local_numel() const {
  int64_t n = 0;
  for (const auto& p : parameters_) n += p.tensor.numel();
  return n;
}

}  // namespace trainer::model
