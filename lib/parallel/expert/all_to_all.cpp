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

at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& receive, const std::vector<int64_t>& send,
                    comm::Communicator& group) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = std::accumulate(receive.begin(), receive.end(), int64_t(0));
  at::Tensor out = at::empty(shape, x.options());
  at::Tensor in = x.contiguous();
  group.all_to_all(out, in, receive, send)->wait();
  return out;
}

struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> receive,
                            std::vector<int64_t> send, c10::intrusive_ptr<GroupHandle> group) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["receive"] = receive;
    ctx->saved_data["send"] = send;
    return exchange(x, receive, send, *group->group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    // What came from rank j goes back to it.
    return {exchange(grads[0], send, receive, *group->group), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& receive_splits,
                           const std::vector<int64_t>& send_splits, comm::Communicator& group) {
  if (group.size() == 1) return x;
  return AllToAllRows::apply(x, receive_splits, send_splits, c10::make_intrusive<GroupHandle>(&group));
}

}  // namespace trainer::parallel
