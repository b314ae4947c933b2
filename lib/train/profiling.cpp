#include "train/profiling.h"

#include <fmt/format.h>

namespace trainer::train {

void Profiling::before_step(int64_t step) {
  profiler_.before_step(step);
  step_scope_.emplace(fmt::format("step {}", step));  // once a step: formatted always
}

void Profiling::after_step(StepEnd& end) {
  step_scope_.reset();
  if (const auto trace = profiler_.after_step(end.step))
    say_(fmt::format("profile of steps {}-{}: one trace per rank in {} (rank 0: {})", config_.steps[0], config_.steps[1],
                     config_.dir.value_or(""), *trace));
}

}  // namespace trainer::train
