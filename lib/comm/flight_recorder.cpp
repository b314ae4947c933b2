#include "comm/flight_recorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <thread>

#include "comm/communicator.h"

namespace trainer::comm {

FlightRecorder::FlightRecorder(const CommContext& context, c10::intrusive_ptr<c10d::Store> store,
                               std::chrono::milliseconds exchange_timeout)
    : context_(context), store_(std::move(store)), exchange_timeout_(exchange_timeout) {}

uint64_t FlightRecorder::begin(const std::string& group, const std::vector<int64_t>& ranks, const std::string& op,
                               int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry e;
  e.id = next_id_++;
  e.group = group;
  e.op = op;
  e.ranks = ranks;
  e.seq = ++started_[group];
  e.bytes = bytes;
  e.step = context_.step.load();
  ring_.push_back(std::move(e));
  if (ring_.size() > kCapacity) ring_.pop_front();
  return ring_.back().id;
}

void FlightRecorder::end(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = ring_.rbegin(); it != ring_.rend(); ++it)
    if (it->id == id) {
      it->finished = true;
      finished_[it->group] = std::max(finished_[it->group], it->seq);
      return;
    }
}

nlohmann::json FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [group, started] : started_) {
    groups[group] = {{"started", started}, {"finished", finished_.count(group) ? finished_.at(group) : 0}};
    for (auto it = ring_.rbegin(); it != ring_.rend(); ++it)
      if (it->group == group) {
        groups[group]["last"] = {{"op", it->op}, {"seq", it->seq}, {"step", it->step}, {"finished", it->finished}};
        break;
      }
  }
  nlohmann::json recent = nlohmann::json::array();
  for (const auto& e : ring_)
    recent.push_back({{"group", e.group}, {"ranks", e.ranks}, {"op", e.op}, {"seq", e.seq}, {"bytes", e.bytes},
                      {"step", e.step}, {"finished", e.finished}});
  return {{"rank", context_.global_rank}, {"groups", groups}, {"recent", recent}};
}

std::string FlightRecorder::describe(const nlohmann::json& e) {
  return fmt::format("{} #{} on {} at step {}{}", e["op"].get<std::string>(), e["seq"].get<int64_t>(),
                     e.contains("group") ? e["group"].get<std::string>() : std::string("its group"),
                     e["step"].get<int64_t>(), e["finished"].get<bool>() ? "" : " (not finished)");
}

std::string FlightRecorder::diagnose(uint64_t id) {
  Entry stuck;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = std::find_if(ring_.begin(), ring_.end(), [&](const Entry& e) { return e.id == id; });
    if (it == ring_.end()) return "flight recorder: the collective is no longer in this rank's record";
    stuck = *it;
  }
  const int64_t me = context_.global_rank;
  const nlohmann::json mine = snapshot();
  std::string text = fmt::format("flight recorder: {} #{} on group {} (ranks [{}]) at step {} did not complete.",
                                 stuck.op, stuck.seq, stuck.group, fmt::join(stuck.ranks, ","), stuck.step);
  // Publish this rank's record, then collect the others' for a bounded time.
  std::map<int64_t, nlohmann::json> records;
  bool store_answers = store_ != nullptr;
  if (store_) {
    try {
      const std::string value = mine.dump();
      store_->set(fmt::format("flight/{}", me), std::vector<uint8_t>(value.begin(), value.end()));
      const auto deadline = std::chrono::steady_clock::now() + exchange_timeout_;
      while (true) {
        for (const int64_t r : stuck.ranks)
          if (r != me && !records.count(r) && store_->check({fmt::format("flight/{}", r)})) {
            const auto bytes = store_->get(fmt::format("flight/{}", r));
            records[r] = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
          }
        if (records.size() + 1 >= stuck.ranks.size() || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (const std::exception&) {
      store_answers = false;  // the store's host is stopped or gone: only this rank's view
    }
  }
  std::vector<std::string> entered, lines;
  entered.push_back(std::to_string(me));
  for (const int64_t r : stuck.ranks) {
    if (r == me) continue;
    const auto rec = records.find(r);
    if (rec == records.end()) {
      // The last collective this rank completed together with it: it was there at least.
      std::string seen = "never seen completing a collective with this rank";
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = ring_.rbegin(); it != ring_.rend(); ++it)
          if (it->finished && std::find(it->ranks.begin(), it->ranks.end(), r) != it->ranks.end()) {
            seen = fmt::format("last seen completing {} #{} on {} at step {}", it->op, it->seq, it->group, it->step);
            break;
          }
      }
      lines.push_back(fmt::format("  rank {} never entered it: {}; {}", r,
                                  store_answers ? "it did not report (stopped, hung or dead)"
                                                : "the rendezvous store does not answer, so no rank could report "
                                                  "(its host, rank 0 or the launcher, may be stopped)",
                                  seen));
      continue;
    }
    const nlohmann::json& groups = rec->second["groups"];
    const int64_t started = groups.contains(stuck.group) ? groups[stuck.group]["started"].get<int64_t>() : 0;
    if (started >= stuck.seq) {
      entered.push_back(std::to_string(r));
      continue;
    }
    // Where it was instead: its most recent collective on any group.
    std::string where = "no collective in its record";
    if (!rec->second["recent"].empty()) where = describe(rec->second["recent"].back());
    lines.push_back(fmt::format("  rank {} never entered it (it reached #{} on {}); its last collective: {}", r,
                                started, stuck.group, where));
  }
  text += fmt::format(" Entered: rank{} {}.", entered.size() == 1 ? "" : "s", fmt::join(entered, ", "));
  for (const auto& l : lines) text += "\n" + l;
  if (lines.empty()) text += "\n  every rank of the group entered it: the transfer itself stalled";
  // This rank's own last collectives (every reporting rank prints its own).
  const auto& recent = mine["recent"];
  std::vector<std::string> last;
  for (size_t i = recent.size() > 4 ? recent.size() - 4 : 0; i < recent.size(); ++i) last.push_back(describe(recent[i]));
  text += fmt::format("\n  rank {}'s last collectives: {}", me, fmt::join(last, "; "));
  return text;
}

}  // namespace trainer::comm
