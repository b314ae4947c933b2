#include "train/periodic_evaluation.h"

namespace trainer::train {

void PeriodicEvaluation::after_step(StepEnd& end) {
  const recipe::Recipe& r = loaded_.recipe;
  if (!held_out_ || !(end.step % r.evaluation.interval == 0 || end.last || end.stopping)) return;
  last_ = evaluate(model_, *held_out_, r, loaded_.mesh.value(), groups_, pipeline_, device_);
  log_.evaluation(end.step, *last_);
}

}  // namespace trainer::train
