#pragma once
// The snapshot of an asynchronous save (DataStates-LLM, REFERENCES.md): host copies of the
// checkpoint's tensors that training cannot change, taken lazily. GPU tensors are copied into
// pinned buffers on a side stream; CPU tensors are copied by the background writer thread. Either
// way training only has to wait before the next optimizer step modifies parameters and optimizer
// state (forward and backward only read them). Buffers are reused from save to save, so a snapshot
// costs one copy and no allocation.
#include <memory>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace trainer::checkpoint {

class HostSnapshot {
 public:
  HostSnapshot();
  ~HostSnapshot();
  HostSnapshot(const HostSnapshot&) = delete;
  HostSnapshot& operator=(const HostSnapshot&) = delete;

  // Points every record at a host buffer of its shape and dtype (the previous save's when they
  // match) and remembers the originals. The buffers must not be in use (the previous save is done).
  void prepare(std::vector<TensorRecord>& records);
  // GPU originals: queues their copies on a side stream, after the work queued so far. Returns at once.
  void start_device_copies();
  // CPU originals: copies them on the calling thread (single-threaded memcpy, so a background
  // thread does not compete with training's thread pool).
  void copy_host_originals();
  // Makes the current CUDA stream wait for the device copies (no host wait).
  void order_current_stream_after_copies();
  // Blocks the calling thread until the device copies are done.
  void wait_device_copies();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::checkpoint
