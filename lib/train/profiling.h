#pragma once
// profiling.steps in the step loop (step_profiler.h): the profiler starts before the range's first
// step and writes its traces after the last; each step is one named scope in the trace, up to its
// checkpoint.
#include <functional>
#include <optional>
#include <string>

#include "runtime/trace_scope.h"
#include "train/step_observer.h"
#include "train/step_profiler.h"

namespace trainer::train {

class Profiling : public StepObserver {
 public:
  using Say = std::function<void(const std::string&)>;
  Profiling(const recipe::ProfilingConfig& config, int64_t rank, bool cuda, Say say)
      : config_(config), profiler_(config, rank, cuda), say_(std::move(say)) {}
  void before_step(int64_t step) override;
  void after_step(StepEnd& end) override;
  // Ends the step's scope when the loop leaves early (a stop on a signal).
  void close_step() { step_scope_.reset(); }

 private:
  recipe::ProfilingConfig config_;
  StepProfiler profiler_;
  Say say_;
  std::optional<runtime::TraceScope> step_scope_;
};

}  // namespace trainer::train
