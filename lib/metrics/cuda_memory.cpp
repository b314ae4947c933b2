#include "metrics/cuda_memory.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace trainer::metrics {

namespace {

constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// The caching allocator creates its per-device state when CUDA is first used; asking it for
// statistics before that throws ("Invalid device argument"), so start CUDA first.
void init_cuda() { at::globalContext().lazyInitDevice(c10::DeviceType::CUDA); }

}  // namespace

bool cuda_memory_available() { return c10::cuda::device_count() > 0; }

CudaMemoryStats cuda_memory_stats() {
  init_cuda();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  CudaMemoryStats out;
  out.allocated_bytes = stats.allocated_bytes[kAggregate].current;
  out.peak_allocated_bytes = stats.allocated_bytes[kAggregate].peak;
  out.reserved_bytes = stats.reserved_bytes[kAggregate].current;
  out.peak_reserved_bytes = stats.reserved_bytes[kAggregate].peak;
  return out;
}

void reset_cuda_peak_memory() {
  init_cuda();
  c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
}

}  // namespace trainer::metrics
