#include "comm/host_staging_communicator.h"

#include <ATen/ATen.h>

#include <functional>
#include <utility>

namespace trainer::comm {

namespace {

// A pinned host tensor shaped like `t` (contiguous), uninitialised.
at::Tensor pinned_like(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
}

// A pinned host copy of `t`. The copy is synchronous: it waits for the current stream's work
// that produces `t`, so the inner (host) operation reads finished values.
at::Tensor to_host(const at::Tensor& t) {
  at::Tensor host = pinned_like(t);
  host.copy_(t);
  return host;
}

class StagedWork : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, std::function<void()> copy_back)
      : inner_(std::move(inner)), copy_back_(std::move(copy_back)) {}
  void wait() override {
    if (done_) return;
    inner_->wait();
    // Queued on the current stream from pinned memory: the caching host allocator keeps the host
    // buffer from reuse until the copy has run.
    if (copy_back_) copy_back_();
    done_ = true;
  }
  // With results still to copy back, only wait() finishes the work.
  bool done() override { return done_ || (!copy_back_ && inner_->done()); }

 private:
  std::unique_ptr<Work> inner_;
  std::function<void()> copy_back_;
  bool done_ = false;
};

class HostStagingCommunicator : public Communicator {
 public:
  explicit HostStagingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int64_t rank() const override { return inner_->rank(); }
  int64_t size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int64_t>& global_ranks() const override { return inner_->global_ranks(); }

  std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) override {
    if (!tensor.is_cuda()) return inner_->all_reduce(tensor, op);
    at::Tensor host = to_host(tensor);
    return staged(inner_->all_reduce(host, op), [tensor, host]() mutable { tensor.copy_(host, true); });
  }

  std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (!input.is_cuda()) return inner_->reduce_scatter(output, input, op);
    at::Tensor host_in = to_host(input), host_out = pinned_like(output);
    // The host input is ours alone: the inner backend may consume it (no copy inside Gloo).
    return staged(inner_->reduce_scatter_consuming(host_out, host_in, op),
                  [output, host_out]() mutable { output.copy_(host_out, true); });
  }

  std::unique_ptr<Work> reduce_scatter_consuming(at::Tensor& output, at::Tensor& input, ReduceOp op) override {
    if (!input.is_cuda()) return inner_->reduce_scatter_consuming(output, input, op);
    return reduce_scatter(output, input, op);
  }

  std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) override {
    if (!output.is_cuda()) return inner_->all_gather(output, input);
    // The input may be a view of the output: copied out before the output's host buffer exists.
    at::Tensor host_in = to_host(input), host_out = pinned_like(output);
    return staged(inner_->all_gather(host_out, host_in), [output, host_out]() mutable { output.copy_(host_out, true); });
  }

  std::unique_ptr<Work> all_to_all(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits,
                                   const std::vector<int64_t>& input_splits) override {
    if (!output.is_cuda()) return inner_->all_to_all(output, input, output_splits, input_splits);
    at::Tensor host_in = to_host(input.contiguous()), host_out = pinned_like(output);
    return staged(inner_->all_to_all(host_out, host_in, output_splits, input_splits),
                  [output, host_out]() mutable { output.copy_(host_out, true); });
  }

  std::unique_ptr<Work> send_recv(const std::vector<P2POp>& ops) override {
    std::vector<P2POp> host_ops = ops;
    std::vector<std::pair<at::Tensor, at::Tensor>> received;  // (device tensor, its host buffer)
    for (auto& op : host_ops) {
      if (!op.tensor.is_cuda()) continue;
      if (op.kind == P2POp::Kind::Send) {
        op.tensor = to_host(op.tensor);
      } else {
        at::Tensor device = op.tensor;
        op.tensor = pinned_like(device);
        received.emplace_back(device, op.tensor);
      }
    }
    std::function<void()> copy_back;
    if (!received.empty())
      copy_back = [received]() mutable {
        for (auto& [device, host] : received) device.copy_(host, true);
      };
    return staged(inner_->send_recv(host_ops), std::move(copy_back));
  }

  std::unique_ptr<Work> broadcast(at::Tensor& tensor, int64_t root) override {
    if (!tensor.is_cuda()) return inner_->broadcast(tensor, root);
    at::Tensor host = to_host(tensor);
    return staged(inner_->broadcast(host, root), [tensor, host]() mutable { tensor.copy_(host, true); });
  }

  void barrier() override { inner_->barrier(); }

 private:
  static std::unique_ptr<Work> staged(std::unique_ptr<Work> inner, std::function<void()> copy_back) {
    return std::make_unique<StagedWork>(std::move(inner), std::move(copy_back));
  }

  std::unique_ptr<Communicator> inner_;
};

}  // namespace

std::unique_ptr<Communicator> stage_through_host(std::unique_ptr<Communicator> inner) {
  return std::make_unique<HostStagingCommunicator>(std::move(inner));
}

}  // namespace trainer::comm
