#pragma once
// How the ranks of a job agree that a checkpoint is complete (docs/checkpoint.md, "Commit
// protocol"): every rank publishes a report once its shard file is durable (or the error that
// stopped it); rank 0 collects all reports before it writes the manifest. Reports go through the
// job's rendezvous store, so no collective is needed and the training thread is never involved.
#include <c10/util/intrusive_ptr.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <vector>

namespace c10d {
class Store;
}

namespace trainer::checkpoint {

class CommitChannel {
 public:
  virtual ~CommitChannel() = default;
  virtual int64_t rank() const = 0;
  // Publishes this rank's report for save number `sequence` (every rank counts saves alike).
  virtual void report(int64_t sequence, const nlohmann::json& report) = 0;
  // Rank 0: every rank's report for `sequence`, in rank order. Throws std::runtime_error naming
  // the ranks that did not report within the timeout.
  virtual std::vector<nlohmann::json> collect(int64_t sequence) = 0;
};

// One process: its own report is the only one.
std::unique_ptr<CommitChannel> single_process_channel();

// Through the rendezvous store (keys "trainer/checkpoint/<sequence>/<rank>").
std::unique_ptr<CommitChannel> store_channel(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
                                             std::chrono::seconds timeout);

}  // namespace trainer::checkpoint
