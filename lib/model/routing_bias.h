#pragma once
// Auxiliary-loss-free load balancing (DeepSeek-V3): a per-expert bias added to the routing scores
// for the choice of experts only (never to the combine weights). After each optimizer step every
// bias moves by rate * sign(mean load - load) of its expert, the loads being the step's token
// copies per expert over all ranks, so each rank holds the same table for every MoE layer of the
// model. It is training state: checkpoints carry it (in the manifest, independent of the mesh).
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include <c10/core/Device.h>

namespace trainer::model {

class RoutingBias {
 public:
  // One row of `experts` zeros per MoE layer (model indices `layers`, in order).
  RoutingBias(std::vector<int64_t> layers, int64_t experts, c10::Device device);
  // The bias of MoE layer `layer` (model index): a view that later updates show through.
  at::Tensor row(int64_t layer) const;
  // loads: [layers, experts] token copies per expert of the step (any float type, any device).
  void update(const at::Tensor& loads, double rate);
  nlohmann::json to_json() const;
  // Throws std::invalid_argument naming what does not fit when `value` has another shape.
  void load(const nlohmann::json& value);
  const at::Tensor& table() const { return table_; }

 private:
  std::vector<int64_t> layers_;
  at::Tensor table_;  // fp32 [layers, experts]
};

}  // namespace trainer::model
