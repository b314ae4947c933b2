#include "comm/nccl_communicator.h"

#include "comm/argument_checks.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

namespace trainer::comm {

namespace {

ncclDataType_t nccl_type(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    default: throw std::invalid_argument(fmt::format("NCCL: unsupported dtype {}", c10::toString(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

class NcclCommunicator;

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, c10::DeviceIndex device) : done_(std::move(done)), device_(device) {}
  void wait() override { done_->block(c10::cuda::getCurrentCUDAStream(device_)); }
  bool done() override { return done_->query(); }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  c10::DeviceIndex device_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::string name, std::vector<int64_t> ranks, int64_t rank,
                   std::shared_ptr<CommContext> context, c10::DeviceIndex device)
      : comm_(comm),
        name_(std::move(name)),
        ranks_(std::move(ranks)),
        rank_(rank),
        context_(std::move(context)),
        device_(device),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)) {
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    ncclCommDestroy(comm_);
  }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return int64_t(ranks_.size()); }
  const std::string& name() const override { return name_; }
  const std::vector<int64_t>& global_ranks() const override { return ranks_; }

  std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) override {
    return run("all_reduce", {tensor}, [&](cudaStream_t s) {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), size_t(tensor.numel()), nccl_type(tensor.scalar_type()),
                           nccl_op(op), comm_, s);
    });
  }

  std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_reduce_scatter(describe("reduce_scatter", context_->step.load()), size(), output, input);
    return run("reduce_scatter", {output, input}, [&](cudaStream_t s) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), size_t(output.numel()),
                               nccl_type(input.scalar_type()), nccl_op(op), comm_, s);
    });
  }

  std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_all_gather(describe("all_gather", context_->step.load()), size(), output, input);
    return run("all_gather", {output, input}, [&](cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), size_t(input.numel()), nccl_type(input.scalar_type()),
                           comm_, s);
    });
  }

  std::unique_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& out_splits,
                                   const std::vector<int64_t>& in_splits) override {
    check_all_to_all(describe("all_to_all", context_->step.load()), size(), output, input, out_splits, in_splits);
    // Elements per row from the shape, not numel / rows: a rank that sends nothing (an input of
    // zero rows) still receives whole rows.
    int64_t row = 1;
    for (int64_t d = 1; d < input.dim(); ++d) row *= input.size(d);
    const size_t element = input.element_size();
    return run("all_to_all", {output, input}, [&](cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      int64_t in_offset = 0, out_offset = 0;
      for (int64_t peer = 0; peer < size() && result == ncclSuccess; ++peer) {
        const auto type = nccl_type(input.scalar_type());
        result = ncclSend(static_cast<const char*>(input.data_ptr()) + in_offset * row * element,
                          size_t(in_splits[peer] * row), type, int(peer), comm_, s);
        if (result == ncclSuccess)
          result = ncclRecv(static_cast<char*>(output.data_ptr()) + out_offset * row * element,
                            size_t(out_splits[peer] * row), type, int(peer), comm_, s);
        in_offset += in_splits[peer];
        out_offset += out_splits[peer];
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    });
  }

  std::unique_ptr<Work> send_recv(const std::vector<P2POp>& unordered) override {
    check_send_recv(describe("send/recv", context_->step.load()), size(), rank_, unordered);
    const std::vector<P2POp> ops = in_matching_order(unordered);  // NCCL matches by order, not tag
    std::vector<at::Tensor> tensors;
    for (const auto& op : ops) tensors.push_back(op.tensor);
    return run("send/recv", tensors, [&](cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      for (const auto& op : ops) {
        if (result != ncclSuccess) break;
        const auto type = nccl_type(op.tensor.scalar_type());
        result = op.kind == P2POp::Kind::Send
                     ? ncclSend(op.tensor.data_ptr(), size_t(op.tensor.numel()), type, int(op.peer), comm_, s)
                     : ncclRecv(op.tensor.data_ptr(), size_t(op.tensor.numel()), type, int(op.peer), comm_, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return result != ncclSuccess ? result : end;
    });
  }

  std::unique_ptr<Work> broadcast(at::Tensor& tensor, int64_t root) override {
    return run("broadcast", {tensor}, [&](cudaStream_t s) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), size_t(tensor.numel()),
                           nccl_type(tensor.scalar_type()), int(root), comm_, s);
    });
  }

  void barrier() override {
    at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    all_reduce(one, ReduceOp::Sum)->wait();
    c10::cuda::getCurrentCUDAStream(device_).synchronize();
  }

 private:
  std::string describe(const std::string& op, int64_t step) const {
    return fmt::format("rank {}: {} on group {} (ranks [{}], this is rank {} of {}) at step {}", context_->global_rank,
                       op, name_, fmt::join(ranks_, ","), rank_, ranks_.size(), step);
  }

  template <typename Launch>
  std::unique_ptr<Work> run(const std::string& op, const std::vector<at::Tensor>& tensors, Launch&& launch) {
    c10::cuda::CUDAGuard guard(device_);
    // The communication stream waits for everything already queued on the compute stream.
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(device_));
    ready.block(stream_);
    const ncclResult_t result = launch(stream_.stream());
    if (result != ncclSuccess)
      throw CommError(fmt::format("{} failed: {}", describe(op, context_->step.load()), ncclGetErrorString(result)));
    // Keep the tensors' memory from being reused before the communication stream is done with it.
    for (const auto& t : tensors)
      if (t.defined() && t.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(stream_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.push_back({done, op, context_->step.load(), std::chrono::steady_clock::now()});
    }
    wake_.notify_all();
    return std::make_unique<NcclWork>(done, device_);
  }

  // Watches in-flight operations: an asynchronous NCCL error or an operation older than the
  // timeout aborts the communicator and ends the process with a message (exit 1).
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, std::chrono::milliseconds(100));
      while (!in_flight_.empty() && in_flight_.front().done->query()) in_flight_.pop_front();
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      const bool late = !in_flight_.empty() &&
                        std::chrono::steady_clock::now() - in_flight_.front().started > context_->timeout;
      if (async != ncclSuccess || late) {
        const auto& op = in_flight_.front();
        std::fprintf(stderr, "%s %s; aborting the job\n", describe(op.name, op.step).c_str(),
                     async != ncclSuccess ? fmt::format("failed: {}", ncclGetErrorString(async)).c_str()
                                          : fmt::format("did not complete within {} s (timeout)",
                                                        context_->timeout.count() / 1000).c_str());
        ncclCommAbort(comm_);
        std::_Exit(1);
      }
    }
  }

  struct InFlight {
    std::shared_ptr<at::cuda::CUDAEvent> done;
    std::string name;
    int64_t step;
    std::chrono::steady_clock::time_point started;
  };

  ncclComm_t comm_;
  std::string name_;
  std::vector<int64_t> ranks_;
  int64_t rank_;
  std::shared_ptr<CommContext> context_;
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream stream_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> in_flight_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::string& store_prefix, std::string name,
                                                     std::vector<int64_t> global_ranks, int64_t global_rank,
                                                     std::shared_ptr<CommContext> context, int device_index) {
  const auto it = std::find(global_ranks.begin(), global_ranks.end(), global_rank);
  if (it == global_ranks.end()) throw std::logic_error("make_nccl_communicator: rank not in the group");
  const int64_t group_rank = it - global_ranks.begin();
  // The unique id: created by the group's first rank, shared through the store.
  ncclUniqueId id;
  const std::string key = store_prefix + "/nccl_unique_id";
  if (group_rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) throw CommError("NCCL: ncclGetUniqueId failed");
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(bytes, bytes + sizeof(id)));
  } else {
    const auto bytes = store->get(key);  // blocks up to the store's timeout
    if (bytes.size() != sizeof(id)) throw CommError("NCCL: malformed unique id in the store");
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<uint8_t*>(&id));
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  ncclComm_t comm;
  const ncclResult_t result = ncclCommInitRank(&comm, int(global_ranks.size()), id, int(group_rank));
  if (result != ncclSuccess)
    throw CommError(fmt::format("rank {}: NCCL initialisation of group {} failed: {}", global_rank, name,
                                ncclGetErrorString(result)));
  return std::make_unique<NcclCommunicator>(comm, std::move(name), std::move(global_ranks), group_rank,
                                            std::move(context), static_cast<c10::DeviceIndex>(device_index));
}

}  // namespace trainer::comm
