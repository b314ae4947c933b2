#include <catch2/catch.hpp>

#include <ATen/ops/empty.h>

#include "metrics/cuda_memory.h"

using namespace trainer::metrics;

TEST_CASE("CUDA memory statistics when there is a GPU", "[metrics]") {
  if (!cuda_memory_available()) {
    WARN("no CUDA device: only checked that the query does not throw");
    return;
  }
  reset_cuda_peak_memory();
  const auto before = cuda_memory_stats();
  CHECK(before.peak_allocated_bytes == before.allocated_bytes);
  {
    const at::Tensor t = at::empty({1 << 20}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    const auto during = cuda_memory_stats();
    // The caching allocator rounds small sizes up; 4 MiB is a multiple of its 512-byte granule.
    CHECK(during.allocated_bytes - before.allocated_bytes == 4 << 20);
    CHECK(during.reserved_bytes >= during.allocated_bytes);
  }
  const auto after = cuda_memory_stats();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.peak_allocated_bytes - before.allocated_bytes == 4 << 20);
  reset_cuda_peak_memory();
  CHECK(cuda_memory_stats().peak_allocated_bytes == after.allocated_bytes);
}
