#pragma once
// Host memory held by CPU tensors, counted at the allocator. libtorch reports nothing like the
// CUDA caching allocator's statistics for the CPU, so we put a byte-counting wrapper in front of
// its CPU allocator: every CPU tensor allocated after install() is counted, and subtracted again
// when its storage is freed.
//
// What is measured: the bytes each allocation asked for (a tensor's storage nbytes), not what
// malloc or the wrapper add on top (alignment rounding, a 64-byte header per allocation, the
// allocator's own bookkeeping), and not memory outside tensors (the process's code, heap objects,
// pinned host buffers from the CUDA host allocator).
#include <cstdint>

namespace trainer::metrics {

class CpuMemoryTracker {
 public:
  // Puts the counting allocator in front of the current CPU allocator (c10::SetAllocator with a
  // priority above the default one). Idempotent and thread-safe; call it before the tensors to be
  // counted are allocated: storages allocated earlier are freed by their original allocator and
  // never counted. Throws std::runtime_error when libtorch keeps another allocator of higher priority.
  static void install();

  // Whether install() has run.
  static bool installed();

  // Bytes in live CPU allocations made since install().
  static int64_t current_bytes();

  // The largest current_bytes() since install() or the last reset_peak().
  static int64_t peak_bytes();

  // Starts a new peak from the current value.
  static void reset_peak();
};

}  // namespace trainer::metrics
