#include <catch2/catch.hpp>

#include <ATen/ops/_lazy_clone.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/core/Allocator.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "metrics/cpu_memory.h"

using trainer::metrics::CpuMemoryTracker;

// What is measured is the storage's nbytes, exactly: the tracker counts the size each allocation
// asked for, not what malloc rounds it to.

TEST_CASE("CPU tensors are counted to the byte and uncounted when freed", "[metrics]") {
  CpuMemoryTracker::install();
  REQUIRE(CpuMemoryTracker::installed());
  const int64_t before = CpuMemoryTracker::current_bytes();
  {
    const at::Tensor floats = at::empty({1000}, at::kFloat);
    CHECK(static_cast<int64_t>(floats.nbytes()) == 4000);
    CHECK(CpuMemoryTracker::current_bytes() - before == 4000);
    const at::Tensor doubles = at::empty({3, 5}, at::kDouble);
    CHECK(CpuMemoryTracker::current_bytes() - before == 4000 + 120);
    // A view shares the storage: nothing new.
    const at::Tensor view = floats.narrow(0, 10, 20);
    CHECK(CpuMemoryTracker::current_bytes() - before == 4120);
  }
  CHECK(CpuMemoryTracker::current_bytes() == before);
}

TEST_CASE("the peak is the high-water mark since the last reset", "[metrics]") {
  CpuMemoryTracker::install();
  CpuMemoryTracker::reset_peak();
  const int64_t before = CpuMemoryTracker::current_bytes();
  CHECK(CpuMemoryTracker::peak_bytes() == before);
  { const at::Tensor big = at::empty({1 << 20}, at::kByte); }
  const at::Tensor small = at::empty({10}, at::kFloat);
  CHECK(CpuMemoryTracker::peak_bytes() - before == (1 << 20));
  CHECK(CpuMemoryTracker::current_bytes() - before == 40);
  CpuMemoryTracker::reset_peak();
  CHECK(CpuMemoryTracker::peak_bytes() == CpuMemoryTracker::current_bytes());
}

TEST_CASE("counted memory is ordinary aligned tensor memory", "[metrics]") {
  CpuMemoryTracker::install();
  const int64_t before = CpuMemoryTracker::current_bytes();
  at::Tensor t = at::ones({1000}, at::kFloat);
  CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 == 0);
  CHECK(t.sum().item<double>() == 1000.0);
  // Growing the storage allocates the new size, copies, frees the old one.
  t.resize_({3000});
  CHECK(CpuMemoryTracker::current_bytes() - before == 12000);
  CHECK(t.narrow(0, 0, 1000).sum().item<double>() == 1000.0);
  // Copy-on-write clones need the allocator's DataPtrs to stay simple (context == data).
  const at::Tensor lazy = t._lazy_clone();
  CHECK(CpuMemoryTracker::current_bytes() - before == 12000);
  t.fill_(2.0);  // materialises t's own copy
  CHECK(CpuMemoryTracker::current_bytes() - before == 24000);
  CHECK(lazy.narrow(0, 0, 1000).sum().item<double>() == 1000.0);
}

TEST_CASE("installing twice does not count twice", "[metrics]") {
  CpuMemoryTracker::install();
  CpuMemoryTracker::install();
  const int64_t before = CpuMemoryTracker::current_bytes();
  const at::Tensor t = at::empty({256}, at::kFloat);
  CHECK(CpuMemoryTracker::current_bytes() - before == 1024);
}

TEST_CASE("the raw allocation interface is counted too", "[metrics]") {
  CpuMemoryTracker::install();
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CPU);
  REQUIRE(allocator->raw_deleter() != nullptr);
  const int64_t before = CpuMemoryTracker::current_bytes();
  void* p = allocator->raw_allocate(100);
  CHECK(CpuMemoryTracker::current_bytes() - before == 100);
  allocator->raw_deallocate(p);
  CHECK(CpuMemoryTracker::current_bytes() == before);
  const c10::DataPtr empty = allocator->allocate(0);
  CHECK(empty.get() == nullptr);
  CHECK(CpuMemoryTracker::current_bytes() == before);
}

TEST_CASE("allocations from many threads balance out", "[metrics]") {
  CpuMemoryTracker::install();
  const int64_t before = CpuMemoryTracker::current_bytes();
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([i] {
      for (int k = 0; k < 500; ++k) {
        const at::Tensor t = at::empty({(k * 7 + i) % 300 + 1}, at::kFloat);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(CpuMemoryTracker::current_bytes() == before);
  CHECK(CpuMemoryTracker::peak_bytes() >= before + 4);
}

TEST_CASE("storages allocated before install are never counted", "[metrics]") {
  // Only meaningful in a fresh process (ctest runs each test case on its own).
  if (CpuMemoryTracker::installed()) {
    WARN("tracker already installed in this process; run this test case alone to exercise it");
    return;
  }
  at::Tensor early = at::empty({1000}, at::kFloat);
  CpuMemoryTracker::install();
  CHECK(CpuMemoryTracker::current_bytes() == 0);
  early.reset();  // freed by the original allocator: the count must not go negative
  CHECK(CpuMemoryTracker::current_bytes() == 0);
}
