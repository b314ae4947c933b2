#include "train/routing_bias_update.h"

#include "train/train_step.h"

namespace trainer::train {

void RoutingBiasUpdate::after_step(StepEnd& end) {
  const double rate = recipe_.model.moe ? recipe_.model.moe->bias_update_rate : 0.0;
  if (model::RoutingBias* bias = model_.routing_bias(); bias && rate > 0) bias->update(end.figures.moe_load, rate);
}

}  // namespace trainer::train
