#include "comm/gloo_communicator.h"

#include "comm/argument_checks.h"
#include "runtime/trace_scope.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

namespace trainer::comm {

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    default: return c10d::ReduceOp::SUM;  // Avg: a sum, divided after completion
  }
}

class GlooCommunicator;

// Wraps c10d work: waits with the job's timeout and turns failures into CommError with context;
// runs a completion step (copying out a chunk, dividing for an average) after the wait.
class GlooWork : public Work {
 public:
  GlooWork(const GlooCommunicator* owner, std::string op, std::vector<c10::intrusive_ptr<c10d::Work>> works,
           std::function<void()> after = nullptr)
      : owner_(owner), op_(std::move(op)), works_(std::move(works)), after_(std::move(after)) {}
  void wait() override;
  bool done() override {
    if (done_) return true;
    for (const auto& w : works_)
      if (!w->isCompleted()) return false;
    return !after_;  // a copy-back still has to run in wait()
  }

 private:
  const GlooCommunicator* owner_;
  std::string op_;
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::function<void()> after_;
  bool done_ = false;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, std::string name, std::vector<int64_t> ranks,
                   int64_t rank, std::shared_ptr<CommContext> context)
      : pg_(std::move(pg)), name_(std::move(name)), ranks_(std::move(ranks)), rank_(rank), context_(std::move(context)) {}

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return int64_t(ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int64_t>& global_ranks() const override { return ranks_; }
  const CommContext& context() const { return *context_; }
  CommContext& mutable_context() const { return *context_; }

  std::string describe(const std::string& op) const {
    return fmt::format("rank {}: {} on group {} (ranks [{}], this is rank {} of {}) at step {}", context_->global_rank,
                       op, name_, fmt::join(ranks_, ","), rank_, ranks_.size(), context_->step.load());
  }

  template <typename F>
  auto guarded(const std::string& op, F&& start) {
    const runtime::TraceScope scope("{} {}", op, name_);  // in profiler traces: the collective and its group
    try {
      return start();
    } catch (const std::exception& e) {
      throw CommError(fmt::format("{} failed to start: {}", describe(op), e.what()));
    }
  }

  std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = context_->timeout;
    auto work = guarded("all_reduce", [&] { return pg_->allreduce(tensors, options); });
    std::function<void()> after;
    if (op == ReduceOp::Avg) after = [tensor, n = size()]() mutable { tensor.div_(double(n)); };
    return std::make_unique<GlooWork>(this, "all_reduce", std::vector{work}, after);
  }

  // Gloo has no reduce-scatter: an all-reduce of a copy of the input, this rank's chunk copied out.
  std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    return all_reduce_then_chunk(output, input, /*in_place=*/false, op);
  }
  // The input is the caller's to lose: all-reduced in place, no copy.
  std::unique_ptr<Work> reduce_scatter_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op) override {
    return all_reduce_then_chunk(output, input, /*in_place=*/true, op);
  }

  // Gloo's allgather receives into a flat buffer it allocates on its worker thread and copies out
  // of, so the host's peak memory would depend on thread timing. Instead: an all-reduce (sum) of
  // the output itself, holding this rank's input in its chunk and -0.0 elsewhere, the additive
  // identity of IEEE arithmetic (x + -0.0 == x for every x, signed zeros included), so the result
  // is the gathered values bit for bit in fp32 and fp64 (a NaN stays a NaN; in bf16 and fp16,
  // which Gloo sums through float, its sign and payload may not survive). Twice the traffic of a
  // ring all-gather; Gloo is the CPU backend (tests, small runs). In place when the input is this
  // rank's chunk of the output.
  std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_all_gather(describe("all_gather"), size(), output, input);
    const int64_t chunk = input.numel(), n = size();
    at::Tensor flat = output.view({-1});
    at::Tensor mine = flat.narrow(0, rank_ * chunk, chunk);
    flat.narrow(0, 0, rank_ * chunk).fill_(-0.0);
    flat.narrow(0, (rank_ + 1) * chunk, (n - rank_ - 1) * chunk).fill_(-0.0);
    if (mine.data_ptr() != input.data_ptr()) mine.copy_(input.view({-1}));
    std::vector<at::Tensor> tensors = {flat};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    options.timeout = context_->timeout;
    auto work = guarded("all_gather", [&] { return pg_->allreduce(tensors, options); });
    return std::make_unique<GlooWork>(this, "all_gather", std::vector{work});
  }

  std::unique_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits) override {
    check_all_to_all(describe("all_to_all"), size(), output, input.contiguous(), out_splits, in_splits);
    c10d::AllToAllOptions options;
    options.timeout = context_->timeout;
    at::Tensor in = input.contiguous();
    std::vector<int64_t> out = out_splits, inn = in_splits;
    auto work = guarded("all_to_all", [&] { return pg_->alltoall_base(output, in, out, inn, options); });
    return std::make_unique<GlooWork>(this, "all_to_all", std::vector{work});
  }

  std::unique_ptr<Work> send_recv(const std::vector<P2POp>& ops) override {
    check_send_recv(describe("send/recv"), size(), rank_, ops);
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (const auto& op : in_matching_order(ops)) {  // checks the tags
      std::vector<at::Tensor> tensors = {op.tensor};
      const int tag = int(op.tag);
      if (op.kind == P2POp::Kind::Send)
        works.push_back(guarded("send", [&] { return pg_->send(tensors, int(op.peer), tag); }));
      else
        works.push_back(guarded("recv", [&] { return pg_->recv(tensors, int(op.peer), tag); }));
    }
    return std::make_unique<GlooWork>(this, "send/recv", std::move(works));
  }

  std::unique_ptr<Work> broadcast(at::Tensor& tensor, int64_t root) override {
    std::vector<at::Tensor> tensors = {tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = context_->timeout;
    auto work = guarded("broadcast", [&] { return pg_->broadcast(tensors, options); });
    return std::make_unique<GlooWork>(this, "broadcast", std::vector{work});
  }

  void barrier() override {
    c10d::BarrierOptions options;
    options.timeout = context_->timeout;
    auto work = guarded("barrier", [&] { return pg_->barrier(options); });
    GlooWork(this, "barrier", {work}).wait();
  }

 private:
  // Sums the input over the group (in place, or a copy of it); when done, output takes this rank's
  // chunk of the sum (unless it is that chunk already: a view of the input).
  std::unique_ptr<Work> all_reduce_then_chunk(at::Tensor& output, const at::Tensor& input, bool in_place, ReduceOp op) {
    check_reduce_scatter(describe("reduce_scatter"), size(), output, input);
    at::Tensor buffer = in_place ? input : input.clone();
    std::vector<at::Tensor> tensors = {buffer};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = context_->timeout;
    auto work = guarded("reduce_scatter", [&] { return pg_->allreduce(tensors, options); });
    const int64_t chunk = output.numel();
    auto after = [output, buffer, chunk, r = rank_, n = size(), op]() mutable {
      at::Tensor mine = buffer.reshape({-1}).narrow(0, r * chunk, chunk).view_as(output);
      if (op == ReduceOp::Avg) mine = mine / double(n);
      if (mine.data_ptr() != output.data_ptr()) output.copy_(mine);
    };
    return std::make_unique<GlooWork>(this, "reduce_scatter", std::vector{work}, after);
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::string name_;
  std::vector<int64_t> ranks_;
  int64_t rank_;
  std::shared_ptr<CommContext> context_;
};

void GlooWork::wait() {
  if (done_) return;
  const auto start = std::chrono::steady_clock::now();
  struct CountWait {  // also when a wait throws
    CommContext& context;
    const std::string& group;
    std::chrono::steady_clock::time_point start;
    ~CountWait() {
      try {
        context.add_wait(group, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
      } catch (...) {  // a destructor, maybe during a CommError's unwinding: the figure is not worth a terminate
      }
    }
  } count{owner_->mutable_context(), owner_->name(), start};
  const runtime::TraceScope scope("wait {} {}", op_, owner_->name());
  for (auto& work : works_) {
    try {
      work->wait(owner_->context().timeout);
    } catch (const std::exception& e) {
      std::string reason = e.what();
      if (auto newline = reason.find('\n'); newline != std::string::npos) reason = reason.substr(0, newline);
      throw CommError(fmt::format("{} failed (timeout {} s): {}. Another rank has probably failed or stopped; see "
                                  "its error",
                                  owner_->describe(op_), owner_->context().timeout.count() / 1000, reason));
    }
  }
  if (after_) after_();
  // Gloo's worker thread lets go of a finished work (and of the tensors it holds) a moment after
  // marking it complete. Waiting for that moment lets those tensors' memory go when the caller
  // lets go of them, not when the thread gets round to it, so a CPU run's peak memory is the same
  // in every run (bounded: a work still referenced elsewhere is left as it is).
  for (auto& work : works_) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (work.use_count() > 1 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  }
  done_ = true;
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::string& store_prefix, std::string name,
                                                     std::vector<int64_t> global_ranks, int64_t global_rank,
                                                     std::shared_ptr<CommContext> context,
                                                     const std::string& interface_address) {
  const auto it = std::find(global_ranks.begin(), global_ranks.end(), global_rank);
  if (it == global_ranks.end()) throw std::logic_error("make_gloo_communicator: rank not in the group");
  const int64_t group_rank = it - global_ranks.begin();
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = context->timeout;
  options->devices.push_back(interface_address.empty()
                                 ? c10d::ProcessGroupGloo::createDefaultDevice()
                                 : c10d::ProcessGroupGloo::createDeviceForHostname(interface_address));
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(store_prefix, store);
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, int(group_rank), int(global_ranks.size()), options);
  return std::make_unique<GlooCommunicator>(std::move(pg), std::move(name), std::move(global_ranks), group_rank,
                                            std::move(context));
}

}  // namespace trainer::comm
