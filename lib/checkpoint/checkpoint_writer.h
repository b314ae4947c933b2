#pragma once
// Saving without stopping training for the write (DataStates-LLM, REFERENCES.md): save() blocks
// only while the tensors are copied to host memory (a snapshot: training may change the originals
// right after), then a background thread serialises, writes, fsyncs and commits the checkpoint
// (checkpoint.h's protocol). One save is in flight at a time: a new save first waits for the
// previous one. A failed write is reported at the next save() or wait(); the previous committed
// checkpoint stays intact.
#include <future>
#include <string>

#include "checkpoint/checkpoint.h"

namespace trainer::checkpoint {

class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, int64_t keep, bool async);
  ~CheckpointWriter();  // waits for the save in flight (errors are printed, not thrown)

  // Returns once the snapshot is taken (async) or the checkpoint is committed (sync).
  // Throws std::runtime_error when the previous save failed.
  void save(CheckpointContent content);
  // Waits for the save in flight; returns the directory of the last committed checkpoint ("" if none).
  std::string wait();
  // Seconds the last save() blocked the caller.
  double last_stall_seconds() const { return last_stall_s_; }

 private:
  std::string dir_;
  int64_t keep_;
  bool async_;
  std::future<std::string> in_flight_;
  std::string last_committed_;
  double last_stall_s_ = 0;
};

}  // namespace trainer::checkpoint
