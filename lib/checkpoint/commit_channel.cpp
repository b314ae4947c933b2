#include "checkpoint/commit_channel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <stdexcept>
#include <thread>

namespace trainer::checkpoint {

namespace {

class SingleProcessChannel final : public CommitChannel {
 public:
  int64_t rank() const override { return 0; }
  void report(int64_t, const nlohmann::json& report) override { last_ = report; }
  std::vector<nlohmann::json> collect(int64_t) override { return {last_}; }

 private:
  nlohmann::json last_;
};

class StoreChannel final : public CommitChannel {
 public:
  StoreChannel(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size, std::chrono::seconds timeout)
      : store_(std::move(store)), rank_(rank), world_size_(world_size), timeout_(timeout) {}
  int64_t rank() const override { return rank_; }

  void report(int64_t sequence, const nlohmann::json& report) override {
    const std::string text = report.dump();
    store_->set(key(sequence, rank_), std::vector<uint8_t>(text.begin(), text.end()));
  }

  std::vector<nlohmann::json> collect(int64_t sequence) override {
    // Polling (rather than one blocking wait) so that a timeout can name the missing ranks.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    std::vector<nlohmann::json> reports(static_cast<size_t>(world_size_));
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < world_size_; ++r) missing.push_back(r);
    while (!missing.empty()) {
      std::vector<int64_t> still;
      for (int64_t r : missing) {
        if (!store_->check({key(sequence, r)})) {
          still.push_back(r);
          continue;
        }
        const auto bytes = store_->get(key(sequence, r));
        reports[size_t(r)] = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
        store_->deleteKey(key(sequence, r));
      }
      missing = std::move(still);
      if (missing.empty()) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(fmt::format("ranks [{}] did not report their checkpoint shards within {} s "
                                             "(parallel.collective_timeout_s)",
                                             fmt::join(missing, ", "), timeout_.count()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return reports;
  }

 private:
  static std::string key(int64_t sequence, int64_t rank) {
    return fmt::format("trainer/checkpoint/{}/{}", sequence, rank);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int64_t rank_, world_size_;
  std::chrono::seconds timeout_;
};

}  // namespace

std::unique_ptr<CommitChannel> single_process_channel() { return std::make_unique<SingleProcessChannel>(); }

std::unique_ptr<CommitChannel> store_channel(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
                                             std::chrono::seconds timeout) {
  return std::make_unique<StoreChannel>(std::move(store), rank, world_size, timeout);
}

}  // namespace trainer::checkpoint
