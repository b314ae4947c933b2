#include "checkpoint/checkpoint_writer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace trainer::checkpoint {

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep, bool async)
    : dir_(std::move(dir)), keep_(keep), async_(async) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: checkpoint write failed: %s\n", e.what());
  }
}

std::string CheckpointWriter::wait() {
  if (in_flight_.valid()) {
    try {
      last_committed_ = in_flight_.get();
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("writing the checkpoint to {} failed: {} (the previous checkpoint is "
                                           "intact)", dir_, e.what()));
    }
  }
  return last_committed_;
}

void CheckpointWriter::save(CheckpointContent content) {
  const auto start = std::chrono::steady_clock::now();
  wait();  // one save in flight at a time
  // The snapshot: host copies that training cannot change. A synchronous save writes before
  // training goes on, so host tensors need no copy then.
  for (auto& t : content.tensors) t.tensor = t.tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/async_);
  const std::string dir = dir_;
  const int64_t keep = keep_;
  auto write = [dir, keep, content = std::move(content)]() { return save_checkpoint(dir, content, keep); };
  if (async_) {
    in_flight_ = std::async(std::launch::async, std::move(write));
  } else {
    last_committed_ = write();
  }
  last_stall_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace trainer::checkpoint
