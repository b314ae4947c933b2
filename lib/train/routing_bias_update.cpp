#include "train/routing_bias_update.h"

#include "train/train_step.h"

namespace trainer::train {

void RoutingBiasUpdate::after_step(StepEnd& end) {
  if (model::RoutingBias* bias = model_.routing_bias()) bias->update(end.figures.moe_load, recipe_.model.moe->bias_update_rate);
}

}  // namespace trainer::train
