#include "train/step_profiler.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <set>
#include <stdexcept>

#include "core/error.h"

namespace trainer::train {

namespace {
namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> a = {ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}
}  // namespace

StepProfiler::StepProfiler(const recipe::ProfilingConfig& config, int64_t rank, bool cuda)
    : config_(config), rank_(rank), cuda_(cuda) {
  if (config_.steps.size() != 2) return;
  // Before the first step: a directory that cannot be made is the recipe's problem, found now.
  const std::string dir = config_.dir.value_or("profiles");
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error)
    throw UserError(fmt::format("profiling.dir {}: cannot be created ({}); choose a directory this job can write", dir,
                                error.message()));
}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  try {
    stop();
  } catch (...) {
    // Already leaving on an error; that error is the one to report.
  }
}

void StepProfiler::before_step(int64_t step) {
  if (config_.steps.size() != 2 || step != config_.steps[0] || recording_) return;
  const ProfilerConfig profiler_config(ProfilerState::KINETO);
  profiler::prepareProfiler(profiler_config, activities(cuda_));
  profiler::enableProfiler(profiler_config, activities(cuda_));
  recording_ = true;
}

std::optional<std::string> StepProfiler::after_step(int64_t step) {
  if (!recording_ || step != config_.steps[1]) return std::nullopt;
  return stop();
}

std::string StepProfiler::stop() {
  recording_ = false;
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  const std::string dir = config_.dir.value_or("profiles");
  std::filesystem::create_directories(dir);
  const std::string path = fmt::format("{}/trace-rank-{:05d}.json", dir, rank_);
  if (!result) throw std::runtime_error("the profiler returned no result for " + path);
  result->save(path);
  return path;
}

}  // namespace trainer::train
