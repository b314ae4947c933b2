#pragma once
// The collective flight recorder: every rank keeps its last collectives (operation, group, the
// group's sequence number, bytes, step, whether it finished). When a collective times out, the
// rank publishes its record in the rendezvous store, collects the records of the group's other
// ranks for a bounded time, and says which ranks never entered that collective: those whose
// record shows they had not reached it (and what they were in), and those that did not report at
// all (stopped, hung or dead), with the last collective they were seen completing. Store calls
// go through a client with a short timeout, so a store whose host froze cannot hang the report.
#include <c10/util/intrusive_ptr.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace trainer::comm {

struct CommContext;

class FlightRecorder {
 public:
  static constexpr size_t kCapacity = 256;

  // `store`: a client of the rendezvous store for the exchange (null: no exchange, only this
  // rank's record); `exchange_timeout`: how long a timed-out rank waits for the others' records.
  FlightRecorder(const CommContext& context, c10::intrusive_ptr<c10d::Store> store,
                 std::chrono::milliseconds exchange_timeout);

  // A collective starts on `group` (its global ranks): returns its id for end() and diagnose().
  uint64_t begin(const std::string& group, const std::vector<int64_t>& ranks, const std::string& op, int64_t bytes);
  void end(uint64_t id);

  // After collective `id` timed out: exchanges records and returns the diagnosis (several lines).
  std::string diagnose(uint64_t id);

  // This rank's record: per group the collectives started and finished, and the recent entries.
  nlohmann::json snapshot() const;

 private:
  struct Entry {
    uint64_t id = 0;
    std::string group, op;
    std::vector<int64_t> ranks;
    int64_t seq = 0;  // 1-based count of collectives on this group
    int64_t bytes = 0, step = 0;
    bool finished = false;
  };
  static std::string describe(const nlohmann::json& entry);

  const CommContext& context_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds exchange_timeout_;
  mutable std::mutex mutex_;
  std::deque<Entry> ring_;
  uint64_t next_id_ = 1;
  std::map<std::string, int64_t> started_, finished_;  // per group
};

}  // namespace trainer::comm
