#include "model/routing_bias.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::model {

RoutingBias::RoutingBias(std::vector<int64_t> layers, int64_t experts, c10::Device device)
    : layers_(std::move(layers)),
      table_(at::zeros({int64_t(layers_.size()), experts}, at::TensorOptions().dtype(at::kFloat).device(device))) {}

at::Tensor RoutingBias::row(int64_t layer) const {
  const auto it = std::find(layers_.begin(), layers_.end(), layer);
  if (it == layers_.end()) throw std::logic_error(fmt::format("layer {} is not an MoE layer", layer));
  return table_[it - layers_.begin()];
}

void RoutingBias::update(const at::Tensor& loads, double rate) {
  at::NoGradGuard no_grad;
  const at::Tensor load = loads.to(table_.device()).to(at::kFloat);
  table_.add_(at::sign(load.mean(1, /*keepdim=*/true) - load), rate);
}

nlohmann::json RoutingBias::to_json() const {
  const at::Tensor host = table_.to(at::kCPU).contiguous();
  nlohmann::json rows = nlohmann::json::object();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const float* p = host[int64_t(l)].data_ptr<float>();
    rows[std::to_string(layers_[l])] = std::vector<float>(p, p + host.size(1));
  }
  return rows;
}

void RoutingBias::load(const nlohmann::json& value) {
  at::Tensor host = at::zeros_like(table_, at::TensorOptions().device(at::kCPU));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const std::string key = std::to_string(layers_[l]);
    if (!value.contains(key))
      throw std::invalid_argument(fmt::format("the routing bias has no row for MoE layer {}", key));
    const std::vector<float> row = value.at(key).get<std::vector<float>>();
    if (int64_t(row.size()) != host.size(1))
      throw std::invalid_argument(fmt::format("the routing bias of MoE layer {} has {} experts, the model {}", key,
                                              row.size(), host.size(1)));
    std::copy(row.begin(), row.end(), host[int64_t(l)].data_ptr<float>());
  }
  at::NoGradGuard no_grad;
  table_.copy_(host);
}

}  // namespace trainer::model
