// The step executor across two pipeline stages in one process: two executors in two threads joined
// by an in-memory mailbox communicator. Each stage's events (posted sends and receives, forwards,
// backwards) follow hand-written orders, and the gradients equal plain autograd over the whole
// model, for 1F1B, GPipe, interleaved 1F1B and zbv (whose middle chunks hand over on one stage).
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/executor.h"
#include "model_test_util.h"

using namespace trainer;

namespace {

// Messages between the two stages, matched by (source, destination, tag).
struct Mailbox {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<std::tuple<int64_t, int64_t, int64_t>, at::Tensor> messages;
};

class MailboxWork : public comm::Work {
 public:
  MailboxWork(Mailbox* box, std::tuple<int64_t, int64_t, int64_t> key, at::Tensor into)
      : box_(box), key_(key), into_(std::move(into)) {}
  void wait() override {
    if (!into_.defined()) return;  // a send: delivered when posted
    std::unique_lock<std::mutex> lock(box_->mutex);
    box_->arrived.wait(lock, [&] { return box_->messages.count(key_) > 0; });
    into_.copy_(box_->messages.at(key_));
    box_->messages.erase(key_);
    into_ = at::Tensor();
  }
  bool done() override { return !into_.defined(); }

 private:
  Mailbox* box_;
  std::tuple<int64_t, int64_t, int64_t> key_;
  at::Tensor into_;
};

class MailboxCommunicator : public comm::Communicator {
 public:
  MailboxCommunicator(Mailbox* box, int64_t rank, std::vector<std::string>* events)
      : box_(box), rank_(rank), events_(events) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return 2; }
  const std::string& name() const override { return name_; }
  const std::vector<int64_t>& global_ranks() const override { return ranks_; }
  std::unique_ptr<comm::Work> send_recv(const std::vector<comm::P2POp>& ops) override {
    REQUIRE(ops.size() == 1);
    const auto& op = ops[0];
    if (op.kind == comm::P2POp::Kind::Send) {
      events_->push_back("send " + std::to_string(op.tag));
      std::lock_guard<std::mutex> lock(box_->mutex);
      box_->messages[{rank_, op.peer, op.tag}] = op.tensor.clone();
      box_->arrived.notify_all();
      return std::make_unique<MailboxWork>(box_, std::make_tuple(rank_, op.peer, op.tag), at::Tensor());
    }
    events_->push_back("post recv " + std::to_string(op.tag));
    return std::make_unique<MailboxWork>(box_, std::make_tuple(op.peer, rank_, op.tag), op.tensor);
  }
  std::unique_ptr<comm::Work> all_reduce(at::Tensor&, comm::ReduceOp) override { throw std::logic_error("unused"); }
  std::unique_ptr<comm::Work> reduce_scatter(at::Tensor&, const at::Tensor&, comm::ReduceOp) override {
    throw std::logic_error("unused");
  }
  std::unique_ptr<comm::Work> all_gather(at::Tensor&, const at::Tensor&) override { throw std::logic_error("unused"); }
  std::unique_ptr<comm::Work> all_to_all(at::Tensor&, const at::Tensor&, const std::vector<int64_t>&,
                                         const std::vector<int64_t>&) override {
    throw std::logic_error("unused");
  }
  std::unique_ptr<comm::Work> broadcast(at::Tensor&, int64_t) override { throw std::logic_error("unused"); }
  void barrier() override {}

 private:
  Mailbox* box_;
  int64_t rank_;
  std::vector<std::string>* events_;
  std::string name_ = "pp";
  std::vector<int64_t> ranks_ = {0, 1};
};

constexpr int64_t kMicro = 3, kRows = 2, kWidth = 4;

// Model chunk c: x -> tanh(x W_c); the last chunk returns the sum of squares as its loss.
at::Tensor chunk_forward(const std::vector<at::Tensor>& weights, int64_t chunks, int64_t m, int64_t c,
                         const at::Tensor& input) {
  const at::Tensor x = c == 0 ? model_test::randn({kRows, kWidth}, uint64_t(100 + m), at::kDouble) : input;
  const at::Tensor y = at::tanh(at::mm(x, weights[size_t(c)]));
  return c == chunks - 1 ? y.pow(2).sum() : y;
}

struct StageRun {
  std::vector<std::string> events;
  std::vector<at::Tensor> grads;  // of the chunks this stage holds (undefined elsewhere)
};

std::vector<StageRun> run_pipeline(const parallel::ScheduleSpec& spec) {
  const int64_t chunks = spec.pp * spec.vpp;
  Mailbox box;
  std::vector<StageRun> runs(2);
  auto stage_main = [&](int64_t stage) {
    std::vector<at::Tensor> weights;
    for (int64_t c = 0; c < chunks; ++c)
      weights.push_back(model_test::randn({kWidth, kWidth}, uint64_t(c + 1), at::kDouble).requires_grad_(true));
    StageRun& run = runs[size_t(stage)];
    MailboxCommunicator group(&box, stage, &run.events);
    auto forward = [&](int64_t m, int64_t c, const at::Tensor& input) {
      run.events.push_back("F" + std::to_string(m) + "c" + std::to_string(c));
      return chunk_forward(weights, chunks, m, c, input);
    };
    engine::StepExecutor::GradientHooks hooks;
    hooks.begin_backward = [&](int64_t c, bool) { run.events.push_back("B c" + std::to_string(c)); };
    engine::PipelineLinks links;
    links.group = &group;
    links.peer = [spec](const parallel::Action& a) { return parallel::peer_stage(spec, a); };
    links.shape = {kRows, kWidth};
    links.options = at::TensorOptions().dtype(at::kDouble);
    // Plain autograd weights: a split backward's B computes them all, its W has nothing queued.
    model::WeightGradQueue queue;
    engine::StepExecutor executor(forward, hooks, &queue, chunks, links);
    executor.run(parallel::stage_schedule(spec, stage));
    for (const auto& w : weights) run.grads.push_back(w.grad().defined() ? w.grad().clone() : at::Tensor());
  };
  std::thread other(stage_main, 1);
  stage_main(0);
  other.join();
  return runs;
}

// Plain autograd over the whole model and all micro-batches.
std::vector<at::Tensor> reference_grads(int64_t chunks) {
  std::vector<at::Tensor> weights;
  for (int64_t c = 0; c < chunks; ++c)
    weights.push_back(model_test::randn({kWidth, kWidth}, uint64_t(c + 1), at::kDouble).requires_grad_(true));
  for (int64_t m = 0; m < kMicro; ++m) {
    at::Tensor x;
    for (int64_t c = 0; c < chunks; ++c) x = chunk_forward(weights, chunks, m, c, x);
    x.backward();
  }
  std::vector<at::Tensor> grads;
  for (const auto& w : weights) grads.push_back(w.grad());
  return grads;
}

void check_grads(const parallel::ScheduleSpec& spec, const std::vector<StageRun>& runs) {
  const int64_t chunks = spec.pp * spec.vpp;
  const auto reference = reference_grads(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    CAPTURE(c);
    const int64_t stage = parallel::place_chunk(spec.kind, spec.pp, spec.vpp, c).stage;
    REQUIRE(runs[size_t(stage)].grads[size_t(c)].defined());
    CHECK(model_test::max_relative_error(runs[size_t(stage)].grads[size_t(c)], reference[size_t(c)]) < 1e-12);
    CHECK_FALSE(runs[size_t(1 - stage)].grads[size_t(c)].defined());
  }
}

// Tags: (gradient? chunks : 0) + chunk, shifted by 20 bits, plus the micro-batch.
std::string tag(bool gradient, int64_t chunks, int64_t chunk, int64_t m) {
  return std::to_string(((int64_t(gradient) * chunks + chunk) << 20) + m);
}

}  // namespace

TEST_CASE("pipeline executor: 1F1B at pp 2 - event order by hand - gradients of plain autograd", "[parallel][executor]") {
  const parallel::ScheduleSpec spec{parallel::ScheduleKind::OneFOneB, 2, 1, kMicro};
  const auto runs = run_pipeline(spec);
  check_grads(spec, runs);
  const auto F = [](int64_t m, int64_t c) { return tag(false, 2, c, m); };
  const auto G = [](int64_t m, int64_t c) { return tag(true, 2, c, m); };
  // Stage 0 runs F0 sendF0 F1 sendF1 recvB0 B0 F2 sendF2 recvB1 B1 recvB2 B2: a send right after
  // its forward; each receive posted as the compute action before the one that needs it starts
  // (recvB0 before F1 runs, recvB1 before F2, recvB2 before B1).
  CHECK(runs[0].events == std::vector<std::string>{"F0c0", "send " + F(0, 0), "post recv " + G(0, 1), "F1c0",
                                                   "send " + F(1, 0), "B c0", "post recv " + G(1, 1), "F2c0",
                                                   "send " + F(2, 0), "post recv " + G(2, 1), "B c0", "B c0"});
  // Stage 1 runs recvF0 F0 B0 sendB0 recvF1 F1 B1 sendB1 recvF2 F2 B2 sendB2: the first receive
  // where it stands (nothing computes before it), the others while the backward before them runs.
  CHECK(runs[1].events == std::vector<std::string>{"post recv " + F(0, 0), "F0c1", "post recv " + F(1, 0), "B c1",
                                                   "send " + G(0, 1), "F1c1", "post recv " + F(2, 0), "B c1",
                                                   "send " + G(1, 1), "F2c1", "B c1", "send " + G(2, 1)});
}

TEST_CASE("pipeline executor: gpipe - interleaved 1F1B and zbv at pp 2 give plain autograd's gradients", "[parallel][executor]") {
  for (const auto& spec : {parallel::ScheduleSpec{parallel::ScheduleKind::GPipe, 2, 1, kMicro},
                           parallel::ScheduleSpec{parallel::ScheduleKind::Interleaved1F1B, 2, 2, kMicro},
                           parallel::ScheduleSpec{parallel::ScheduleKind::ZBV, 2, 2, kMicro}}) {
    CAPTURE(parallel::schedule_name(spec.kind));
    check_grads(spec, run_pipeline(spec));
  }
}
