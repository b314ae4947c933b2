#pragma once
// GPU memory as libtorch's CUDA caching allocator sees it, for the current device. Only call these
// when a CUDA device is present (cuda_memory_available()); the library links without one.
#include <cstdint>

namespace trainer::metrics {

struct CudaMemoryStats {
  int64_t allocated_bytes = 0;       // held by live tensors now
  int64_t peak_allocated_bytes = 0;  // the most held by tensors since the last reset
  int64_t reserved_bytes = 0;        // taken from the driver by the caching allocator now (>= allocated)
  int64_t peak_reserved_bytes = 0;   // the most reserved since the last reset
};

// Whether at least one CUDA device can be used. Never throws.
bool cuda_memory_available();

// The caching allocator's statistics for the current CUDA device.
CudaMemoryStats cuda_memory_stats();

// Starts new peaks (allocated and reserved) at the current values, on the current CUDA device.
void reset_cuda_peak_memory();

}  // namespace trainer::metrics
