#include "parallel/tensor/communication.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include "parallel/tensor/group_handle.h"

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Op : int64_t { Identity, AllReduce, AllGather, ReduceScatter, Chunk };

at::Tensor apply_op(Op op, const at::Tensor& x, comm::Communicator& g) {
  switch (op) {
    case Op::Identity: return x;
    case Op::AllReduce: {
      at::Tensor out = x.contiguous().clone();
      g.all_reduce(out, comm::ReduceOp::Sum)->wait();
      return out;
    }
    case Op::AllGather: {  // [n * s, ...] from every rank's [s, ...], in rank order
      std::vector<int64_t> shape = x.sizes().vec();
      shape[0] *= g.size();
      at::Tensor out = at::empty(shape, x.options());
      g.all_gather(out, x.contiguous())->wait();
      return out;
    }
    case Op::ReduceScatter: {  // this rank's [s / n, ...] of the sum of every rank's [s, ...]
      std::vector<int64_t> shape = x.sizes().vec();
      shape[0] /= g.size();
      at::Tensor out = at::empty(shape, x.options());
      g.reduce_scatter(out, x.contiguous(), comm::ReduceOp::Sum)->wait();
      return out;
    }
    case Op::Chunk: {
      const int64_t part = x.size(0) / g.size();
      return x.narrow(0, part * g.rank(), part).contiguous();
    }
  }
  return x;
}

struct TpCommunication : public torch::autograd::Function<TpCommunication> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupHandle> group,
                            int64_t forward_op, int64_t backward_op) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["backward_op"] = backward_op;
    return apply_op(Op(forward_op), x, *group->group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    const Op op = Op(ctx->saved_data["backward_op"].toInt());
    return {apply_op(op, grads[0], *group->group), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor communicate(const at::Tensor& x, comm::Communicator& tp, Op forward, Op backward) {
  if (tp.size() == 1) return x;
  return TpCommunication::apply(x, c10::make_intrusive<GroupHandle>(&tp), int64_t(forward), int64_t(backward));
}

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, comm::Communicator& tp) {
  return communicate(x, tp, Op::Identity, Op::AllReduce);
}
at::Tensor reduce_from_tp(const at::Tensor& x, comm::Communicator& tp) {
  return communicate(x, tp, Op::AllReduce, Op::Identity);
}
at::Tensor gather_from_sp(const at::Tensor& x, comm::Communicator& tp) {
  return communicate(x, tp, Op::AllGather, Op::ReduceScatter);
}
at::Tensor reduce_scatter_to_sp(const at::Tensor& x, comm::Communicator& tp) {
  return communicate(x, tp, Op::ReduceScatter, Op::AllGather);
}
at::Tensor scatter_to_sp(const at::Tensor& x, comm::Communicator& tp) {
  return communicate(x, tp, Op::Chunk, Op::AllGather);
}

}  // namespace trainer::parallel
