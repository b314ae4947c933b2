#pragma once
// Saving without stopping training for the write (DataStates-LLM, REFERENCES.md).
//
// Asynchronous (checkpoint.async): save() hands the tensors to a snapshot (host_snapshot.h) and a
// background thread, and returns. The thread copies CPU tensors into host buffers (GPU tensors are
// copied on a side stream), then writes this rank's shard file, fsyncs it and reports it through
// the commit channel; on rank 0 it then collects every rank's report, writes the manifest, renames
// the directory into place, moves `latest` and prunes old checkpoints (checkpoint.h). Training
// calls before_parameter_update() before each optimizer step: the only wait, and only until the
// snapshot is complete.
//
// Synchronous: save() writes from the tensors themselves and returns once this rank's shard is
// durable (rank 0: once the checkpoint is committed). Pruning old checkpoints runs in the
// background either way.
//
// One save is in flight at a time: a new save first waits for the previous one. A failed write
// is reported at the next save() or wait(); the previous committed checkpoint stays intact.
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/commit_channel.h"
#include "checkpoint/host_snapshot.h"

namespace trainer::checkpoint {

struct WriterOptions {
  std::string dir;
  int64_t keep = 0;  // committed checkpoints kept (0: all)
  bool async = true;
  std::shared_ptr<CommitChannel> channel;  // null: a single process
};

class CheckpointWriter {
 public:
  explicit CheckpointWriter(WriterOptions options);
  ~CheckpointWriter();  // waits for the save in flight (errors are printed, not thrown)

  // Asynchronous saves: prepares the snapshot buffer for checkpoints like `content` in the
  // background (host_snapshot.h: reserve), so that the first save stalls no longer than later ones.
  void reserve(const CheckpointContent& content);
  // Starts saving this rank's part of a checkpoint (every rank calls it, in the same order).
  // Throws std::runtime_error when the previous save failed.
  void save(CheckpointContent content);
  // Before the optimizer modifies parameters or optimizer state: waits until the snapshot of the
  // save in flight is taken (GPU: orders the current stream after the copies, no host wait).
  // Returns the seconds it blocked.
  double before_parameter_update();
  // Whether a snapshot is still to be waited for by before_parameter_update().
  bool snapshot_pending() const { return snapshot_pending_; }
  // Waits for the save in flight; returns the directory of the last committed checkpoint (rank 0;
  // other ranks return "").
  std::string wait();
  // The checkpoint committed since the last call, if any, without waiting (rank 0; others: none).
  // Throws like wait() when the save in flight failed.
  std::optional<std::string> take_committed();

 private:
  WriterOptions options_;
  int64_t sequence_ = 0;
  HostSnapshot snapshot_;
  FileWriter file_writer_;  // synchronous saves from CPU tensors; one save at a time
  std::shared_future<void> snapshot_taken_;
  bool snapshot_pending_ = false;
  std::future<std::string> in_flight_;
  std::future<void> reserved_;  // the background reserve(); save() waits for it
  std::string last_committed_;
  std::string reported_;  // the last directory take_committed() returned
};

}  // namespace trainer::checkpoint
