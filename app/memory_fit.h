#pragma once
// The memory check of `trainer run`: before anything is allocated, the estimator's per-rank peak
// (the same arithmetic as `trainer estimate`) is compared with what this rank has, and a run that
// cannot fit is refused (exit 2) instead of dying minutes later of an out-of-memory error or the
// kernel's SIGKILL. An allocation that fails anyway is reported with the estimate and the fixes.
#include <exception>
#include <string>

#include "recipe/load.h"
#include "runtime/device_assignment.h"
#include "runtime/device_memory.h"

namespace trainer::app {

// What the memory check found: the estimate's per-rank peak and what this rank has.
struct MemoryFit {
  double needed_bytes = 0;
  runtime::AvailableMemory available;
};

// The estimator's per-rank peak against what this rank has: its GPU's free memory (shared by the
// ranks on that GPU), or on the CPU MemAvailable shared by `local_ranks` (and the cgroup's limit,
// ulimit -v).
MemoryFit measure_memory_fit(const recipe::LoadedRecipe& loaded, const runtime::DeviceAssignment& device,
                             int64_t local_ranks, int cpu_threads);
// Throws UserError (with the numbers, the fixes and --no-memory-check) when the peak exceeds what
// this rank has; nothing when the available memory is unknown.
void check_memory_fit(const recipe::LoadedRecipe& loaded, const MemoryFit& fit);

// Whether `e` is an allocation that failed (std::bad_alloc, c10's out-of-memory errors).
bool is_out_of_memory(const std::exception& e);
// "out of memory on the CPU (...); the estimate for this run is ... per rank, ...; to fit, ..."
std::string out_of_memory_message(const std::exception& e, const recipe::LoadedRecipe& loaded, const MemoryFit& fit);

}  // namespace trainer::app
