#include "comm/recording_communicator.h"

#include <ATen/core/Tensor.h>

namespace trainer::comm {

namespace {

class RecordedWork : public Work {
 public:
  RecordedWork(std::unique_ptr<Work> inner, FlightRecorder& recorder, uint64_t id)
      : inner_(std::move(inner)), recorder_(recorder), id_(id) {}
  void wait() override {
    if (done_) return;
    try {
      inner_->wait();
    } catch (const CommError& e) {
      throw CommError(std::string(e.what()) + "\n" + recorder_.diagnose(id_));
    }
    recorder_.end(id_);
    done_ = true;
  }
  bool done() override {
    if (!done_ && inner_->done()) {  // polled to completion (never waited for): finished all the same
      recorder_.end(id_);
      done_ = true;
    }
    return done_;
  }

 private:
  std::unique_ptr<Work> inner_;
  FlightRecorder& recorder_;
  uint64_t id_;
  bool done_ = false;
};

class RecordingCommunicator : public Communicator {
 public:
  RecordingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<FlightRecorder> recorder)
      : inner_(std::move(inner)), recorder_(std::move(recorder)) {}

  int64_t rank() const override { return inner_->rank(); }
  int64_t size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int64_t>& global_ranks() const override { return inner_->global_ranks(); }

  std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const uint64_t id = begin("all_reduce", int64_t(tensor.nbytes()));
    return recorded(inner_->all_reduce(tensor, op), id);
  }
  std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    const uint64_t id = begin("reduce_scatter", int64_t(input.nbytes()));
    return recorded(inner_->reduce_scatter(output, input, op), id);
  }
  std::unique_ptr<Work> reduce_scatter_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op) override {
    const uint64_t id = begin("reduce_scatter", int64_t(input.nbytes()));
    return recorded(inner_->reduce_scatter_consuming(output, input, op), id);
  }
  std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) override {
    const uint64_t id = begin("all_gather", int64_t(output.nbytes()));
    return recorded(inner_->all_gather(output, input), id);
  }
  std::unique_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                                   const std::vector<int64_t>& input_splits) override {
    const uint64_t id = begin("all_to_all", int64_t(input.nbytes()));
    return recorded(inner_->all_to_all(output, input, output_splits, input_splits), id);
  }
  std::unique_ptr<Work> send_recv(const std::vector<P2POp>& ops) override {
    int64_t bytes = 0;
    for (const auto& op : ops) bytes += int64_t(op.tensor.nbytes());
    const uint64_t id = begin("send/recv", bytes);
    return recorded(inner_->send_recv(ops), id);
  }
  std::unique_ptr<Work> broadcast(at::Tensor& tensor, int64_t root) override {
    const uint64_t id = begin("broadcast", int64_t(tensor.nbytes()));
    return recorded(inner_->broadcast(tensor, root), id);
  }
  void barrier() override {
    const uint64_t id = begin("barrier", 0);
    try {
      inner_->barrier();
    } catch (const CommError& e) {
      throw CommError(std::string(e.what()) + "\n" + recorder_->diagnose(id));
    }
    recorder_->end(id);
  }

 private:
  uint64_t begin(const char* op, int64_t bytes) { return recorder_->begin(name(), global_ranks(), op, bytes); }
  std::unique_ptr<Work> recorded(std::unique_ptr<Work> work, uint64_t id) {
    return std::make_unique<RecordedWork>(std::move(work), *recorder_, id);
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<FlightRecorder> recorder_;
};

}  // namespace

std::unique_ptr<Communicator> record_collectives(std::unique_ptr<Communicator> inner,
                                                 std::shared_ptr<FlightRecorder> recorder) {
  return std::make_unique<RecordingCommunicator>(std::move(inner), std::move(recorder));
}

}  // namespace trainer::comm
