#pragma once
// The snapshot of an asynchronous save (DataStates-LLM, REFERENCES.md), taken straight into this
// rank's shard file as it will be on disk: the safetensors header, then every tensor's bytes, in
// one page-aligned host buffer (pinned when tensors live on a GPU) that is reused from save to
// save. GPU tensors are copied into it on a side stream; CPU tensors are copied by the background
// writer thread; the buffer is then written with O_DIRECT as it is. So a save costs one copy from
// the training tensors to host memory and one DMA to the disk, and no allocation after the first.
//
// Training only has to wait before the next optimizer step modifies parameters and optimizer
// state (forward and backward only read them).
#include <memory>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_writer.h"

namespace trainer::checkpoint {

class HostSnapshot {
 public:
  HostSnapshot();
  ~HostSnapshot();
  HostSnapshot(const HostSnapshot&) = delete;
  HostSnapshot& operator=(const HostSnapshot&) = delete;

  // Allocates the buffer that prepare() will need for `records` and touches every page, so that the
  // first save does not pay for faulting in a fresh buffer while training waits for its copy (a
  // 400 MB snapshot: 0.9 s of stall on the first save instead of milliseconds). Meant to run on a
  // background thread at start-up, before the first prepare() (which must not run concurrently).
  void reserve(const std::vector<TensorRecord>& records, int64_t rank);
  // Lays out rank `rank`'s shard file for `records` in the buffer (grown when too small) and
  // remembers the originals. The buffer must not be in use (the previous save is done).
  void prepare(const std::vector<TensorRecord>& records, int64_t rank);
  // GPU originals: queues their copies on a side stream, after the work queued so far. Returns at once.
  void start_device_copies();
  // CPU originals: copies them on the calling thread (single-threaded memcpy, so that a background
  // thread does not compete with training's thread pool).
  void copy_host_originals();
  // Makes the current CUDA stream wait for the device copies (no host wait).
  void order_current_stream_after_copies();
  // Waits for the device copies, then writes the file into DIR/step-NNNNNNNN.tmp/ (fsynced) and
  // returns the rank's report for the commit (see write_rank_shard).
  nlohmann::json write(const std::string& dir, int64_t step, FileWriter& writer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::checkpoint
