#pragma once
// A named range in profiler traces (profiling.steps, train/step_profiler.h): forward and backward
// per model chunk and micro-batch, each collective with its group, the optimizer, the checkpoint
// snapshot. Without a running profiler it costs a check of libtorch's callback list; the name is
// only formatted while one runs.
#include <ATen/record_function.h>
#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace trainer::runtime {

class TraceScope {
 public:
  explicit TraceScope(std::string_view name) : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before(name);
  }
  // The name is fmt::format(format, args...), built only while a profiler records.
  template <typename... Args>
  TraceScope(fmt::format_string<Args...> format, Args&&... args) : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before(fmt::format(format, std::forward<Args>(args)...));
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace trainer::runtime
