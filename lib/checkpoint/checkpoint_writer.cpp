#include "checkpoint/checkpoint_writer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cstdio>
#include <stdexcept>

namespace trainer::checkpoint {

namespace {

constexpr int kWriterNiceness = 10;  // below training's threads (0), above idle

// What every rank does once its tensors are on the host: write (`write_shard` returns the report)
// and report; rank 0 also commits once every rank's shard is durable.
std::string write_report_commit(const WriterOptions& options, CommitChannel& channel, int64_t sequence,
                                const CheckpointContent& content, const std::function<nlohmann::json()>& write_shard) {
  nlohmann::json report;
  std::string error;
  try {
    report = write_shard();
  } catch (const std::exception& e) {
    error = e.what();
    report = {{"error", error}};
  }
  channel.report(sequence, report);
  if (channel.rank() != 0) {
    if (!error.empty()) throw std::runtime_error(error);
    return "";
  }
  try {
    const std::vector<nlohmann::json> reports = channel.collect(sequence);
    for (size_t r = 0; r < reports.size(); ++r)
      if (reports[r].contains("error"))
        throw std::runtime_error(fmt::format("rank {}: {}", r, reports[r].at("error").get<std::string>()));
    return commit_checkpoint(options.dir, content, reports);
  } catch (...) {
    try {
      discard_staging(options.dir, content.step);
    } catch (...) {
    }
    throw;
  }
}

}  // namespace

CheckpointWriter::CheckpointWriter(WriterOptions options) : options_(std::move(options)) {
  if (!options_.channel) options_.channel = single_process_channel();
}

CheckpointWriter::~CheckpointWriter() {
  try {
    if (reserved_.valid()) reserved_.get();
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
}

std::string CheckpointWriter::wait() {
  if (in_flight_.valid()) {
    try {
      std::string committed = in_flight_.get();
      if (!committed.empty()) last_committed_ = committed;
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("writing the checkpoint to {} failed: {} (the previous checkpoint is "
                                           "intact)", options_.dir, e.what()));
    }
  }
  snapshot_pending_ = false;
  return last_committed_;
}

std::optional<std::string> CheckpointWriter::take_committed() {
  // A finished save: wait() returns at once (its write waited for the snapshot copies already).
  if (in_flight_.valid() && in_flight_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) wait();
  if (last_committed_.empty() || last_committed_ == reported_) return std::nullopt;
  reported_ = last_committed_;
  return reported_;
}

double CheckpointWriter::before_parameter_update() {
  if (!snapshot_pending_) return 0;
  const auto start = std::chrono::steady_clock::now();
  snapshot_taken_.get();  // rethrows a failed copy
  snapshot_.order_current_stream_after_copies();
  snapshot_pending_ = false;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CheckpointWriter::reserve(const CheckpointContent& content) {
  if (!options_.async || reserved_.valid()) return;
  const int64_t rank = options_.channel->rank();
  reserved_ = std::async(std::launch::async, [this, records = content.tensors, rank] {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNiceness);  // training goes first
    snapshot_.reserve(records, rank);
  });
}

void CheckpointWriter::save(CheckpointContent content) {
  wait();  // one save in flight at a time; the snapshot buffers are free again
  if (reserved_.valid()) reserved_.get();  // rethrows a failed allocation
  const int64_t sequence = ++sequence_;
  const WriterOptions options = options_;
  auto* channel = options_.channel.get();
  const int64_t rank = channel->rank();
  if (!options_.async) {
    // The tensors themselves are written (GPU ones copied to the host first), before training goes on.
    bool on_device = false;
    for (const auto& t : content.tensors) on_device = on_device || t.tensor.is_cuda();
    if (on_device) {
      snapshot_.prepare(content.tensors, rank);
      snapshot_.start_device_copies();
    }
    auto write_shard = [&]() {
      return on_device ? snapshot_.write(options.dir, content.step, file_writer_)
                       : write_rank_shard(options.dir, content.step, rank, content.tensors, &file_writer_);
    };
    std::string committed;
    try {
      committed = write_report_commit(options, *channel, sequence, content, write_shard);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("writing the checkpoint to {} failed: {} (the previous checkpoint is "
                                           "intact)", options_.dir, e.what()));
    }
    if (rank == 0) last_committed_ = committed;
    if (rank == 0 && options.keep > 0)  // deleting old checkpoints need not stop training
      in_flight_ = std::async(std::launch::async, [options, committed] {
        prune_checkpoints(options.dir, options.keep, committed);
        return committed;
      });
    return;
  }
  snapshot_.prepare(content.tensors, rank);
  snapshot_.start_device_copies();
  content.tensors.clear();  // the snapshot holds them now; the commit needs only the metadata
  auto taken = std::make_shared<std::promise<void>>();
  snapshot_taken_ = taken->get_future().share();
  snapshot_pending_ = true;
  in_flight_ = std::async(std::launch::async, [this, options, channel, sequence, taken,
                                               content = std::move(content)]() -> std::string {
    try {
      snapshot_.copy_host_originals();
      taken->set_value();
    } catch (const std::exception& e) {
      taken->set_exception(std::current_exception());
      channel->report(sequence, {{"error", std::string("taking the snapshot: ") + e.what()}});
      throw;
    }
    // The write yields the cores to training (a CPU run uses them all); the snapshot above could not,
    // since the next optimizer step waits for it. Threads started from here inherit the priority.
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kWriterNiceness);
    const std::string committed = write_report_commit(options, *channel, sequence, content, [&] {
      return snapshot_.write(options.dir, content.step, file_writer_);
    });
    if (channel->rank() == 0) prune_checkpoints(options.dir, options.keep, committed);
    return committed;
  });
}

}  // namespace trainer::checkpoint
