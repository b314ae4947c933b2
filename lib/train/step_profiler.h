#pragma once
// profiling.steps [first, last] and profiling.dir: libtorch's profiler (Kineto) records steps
// first..last on every rank (ATen operators, trainer's named scopes from runtime/trace_scope.h,
// and on a GPU its kernels and NCCL) and each rank writes one Chrome/Perfetto trace,
// <dir>/trace-rank-<rank>.json. Outside that range nothing is recorded.
#include <cstdint>
#include <optional>
#include <string>

#include "recipe/recipe.h"

namespace trainer::train {

class StepProfiler {
 public:
  StepProfiler(const recipe::ProfilingConfig& config, int64_t rank, bool cuda);
  ~StepProfiler();  // a run that stops inside the range still writes its trace
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around training step `step` (1-based): starts recording before the first step of the range,
  // stops and writes the trace after its last. Returns the trace's path when one was written.
  void before_step(int64_t step);
  std::optional<std::string> after_step(int64_t step);

 private:
  std::string stop();

  recipe::ProfilingConfig config_;
  int64_t rank_;
  bool cuda_;
  bool recording_ = false;
};

}  // namespace trainer::train
