#include "parallel/expert/all_to_all.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>

#include "parallel/tensor/group_handle.h"

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The exchange's output; `pending` (when given) keeps the collective in flight instead of
// waiting for it, with the input it reads.
at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& receive, const std::vector<int64_t>& send,
                    comm::Communicator& group, RowsInFlight::State* pending = nullptr);

}  // namespace

struct RowsInFlight::State {
  std::unique_ptr<comm::Work> work;
  at::Tensor input;
};

namespace {

at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& receive, const std::vector<int64_t>& send,
                    comm::Communicator& group, RowsInFlight::State* pending) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = std::accumulate(receive.begin(), receive.end(), int64_t(0));
  at::Tensor out = at::empty(shape, x.options());
  at::Tensor in = x.contiguous();
  auto work = group.all_to_all(out, in, receive, send);
  if (pending) {
    pending->work = std::move(work);
    pending->input = in;
  } else {
    work->wait();
  }
  return out;
}

// Carries the in-flight state through the autograd function's arguments (a capsule).
struct PendingHandle : torch::CustomClassHolder {
  explicit PendingHandle(std::shared_ptr<RowsInFlight::State> s) : state(std::move(s)) {}
  std::shared_ptr<RowsInFlight::State> state;
};

struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> receive,
                            std::vector<int64_t> send, c10::intrusive_ptr<GroupHandle> group,
                            c10::intrusive_ptr<PendingHandle> pending) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["send"] = send;
    return exchange(x, receive, send, *group->group, pending ? pending->state.get() : nullptr);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    // What came from rank j goes back to it.
    return {exchange(grads[0], send, receive, *group->group), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& receive_splits,
                           const std::vector<int64_t>& send_splits, comm::Communicator& group) {
  if (group.size() == 1) return x;
  return AllToAllRows::apply(x, receive_splits, send_splits, c10::make_intrusive<GroupHandle>(&group),
                             c10::intrusive_ptr<PendingHandle>());
}

RowsInFlight start_all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& receive_splits,
                                   const std::vector<int64_t>& send_splits, comm::Communicator& group) {
  auto state = std::make_shared<RowsInFlight::State>();
  if (group.size() == 1) return RowsInFlight(x, state);
  at::Tensor rows = AllToAllRows::apply(x, receive_splits, send_splits, c10::make_intrusive<GroupHandle>(&group),
                                        c10::make_intrusive<PendingHandle>(state));
  return RowsInFlight(std::move(rows), std::move(state));
}

at::Tensor RowsInFlight::wait() {
  if (state_ && state_->work) {
    state_->work->wait();
    state_->work.reset();
    state_->input = at::Tensor();
  }
  return std::move(rows_);
}

}  // namespace trainer::parallel
