#pragma once
// Auxiliary-loss-free balancing (model.moe.bias_update_rate): after each step every rank moves the
// same routing biases by the step's expert loads (model/routing_bias.h).
#include "model/transformer.h"
#include "train/step_observer.h"

namespace trainer::train {

class RoutingBiasUpdate : public StepObserver {
 public:
  RoutingBiasUpdate(model::Transformer& model, const recipe::Recipe& recipe) : model_(model), recipe_(recipe) {}
  void after_step(StepEnd& end) override;

 private:
  model::Transformer& model_;
  const recipe::Recipe& recipe_;
};

}  // namespace trainer::train
