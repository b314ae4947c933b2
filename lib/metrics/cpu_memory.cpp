#include "metrics/cpu_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <new>
#include <mutex>
#include <stdexcept>

namespace trainer::metrics {

namespace {

// Each allocation carries its own size and the inner allocator's way of freeing it in a header in
// front of the data. That keeps the DataPtr "simple" (context == data, one fixed deleter) as
// libtorch's CPU allocator promises, so raw_allocate/raw_deallocate and copy-on-write storages keep
// working, and needs neither a per-allocation heap object nor a locked size table.
struct Header {
  int64_t bytes;                    // what the caller asked for: the amount counted
  void* inner_context;              // the inner allocator's DataPtr context
  c10::DeleterFnPtr inner_deleter;  // and its deleter
};
// 64 bytes keep the default CPU allocator's 64-byte alignment of the data.
constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(Header) <= kHeaderBytes);

// Above REGISTER_ALLOCATOR's priority 0, which the default CPU allocator is registered with.
constexpr uint8_t kPriority = 1;

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

void add_bytes(int64_t bytes) {
  const int64_t now = g_current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void counting_delete(void* data) {
  if (data == nullptr) return;
  Header header;
  std::memcpy(&header, static_cast<char*>(data) - kHeaderBytes, sizeof header);
  g_current.fetch_sub(header.bytes, std::memory_order_relaxed);
  if (header.inner_context != nullptr && header.inner_deleter != nullptr) header.inner_deleter(header.inner_context);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    // Like the default allocator, an empty allocation has no memory (and nothing to count).
    if (n == 0) return {nullptr, nullptr, &counting_delete, cpu};
    if (n > std::numeric_limits<size_t>::max() - kHeaderBytes) throw std::bad_alloc();
    c10::DataPtr inner = inner_->allocate(n + kHeaderBytes);
    char* base = static_cast<char*>(inner.get());
    const Header header{static_cast<int64_t>(n), inner.get_context(), inner.get_deleter()};
    // The header now owns the inner allocation; counting_delete gives it back.
    inner.release_context();
    std::memcpy(base, &header, sizeof header);
    add_bytes(header.bytes);
    void* data = base + kHeaderBytes;
    return {data, data, &counting_delete, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &counting_delete; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* inner_;
};

std::once_flag g_install_once;

}  // namespace

void CpuMemoryTracker::install() {
  std::call_once(g_install_once, [] {
    c10::Allocator* inner = c10::GetAllocator(c10::DeviceType::CPU);
    // SetAllocator keeps a raw pointer for the life of the process.
    static CountingAllocator counting(inner);
    c10::SetAllocator(c10::DeviceType::CPU, &counting, kPriority);
    if (c10::GetAllocator(c10::DeviceType::CPU) != &counting)
      throw std::runtime_error(
          "CpuMemoryTracker::install: libtorch kept a CPU allocator of higher priority; CPU memory cannot be counted");
    g_installed.store(true);
  });
}

bool CpuMemoryTracker::installed() { return g_installed.load(); }

int64_t CpuMemoryTracker::current_bytes() { return g_current.load(std::memory_order_relaxed); }

int64_t CpuMemoryTracker::peak_bytes() { return g_peak.load(std::memory_order_relaxed); }

void CpuMemoryTracker::reset_peak() { g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace trainer::metrics
