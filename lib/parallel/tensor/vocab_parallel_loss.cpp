#include "parallel/tensor/vocab_parallel_loss.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>

#include "parallel/tensor/group_handle.h"

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            int64_t vocab_begin, int64_t vocab_end, int64_t ignore_index,
                            c10::intrusive_ptr<GroupHandle> group) {
    comm::Communicator& tp = *group->group;
    const int64_t local = logits.size(1);
    at::Tensor masked = logits;
    const int64_t real = std::max<int64_t>(0, std::min(local, vocab_end - vocab_begin));
    if (real < local) {  // padding columns: out of the softmax
      masked = logits.clone();
      masked.narrow(1, real, local - real).fill_(-std::numeric_limits<float>::infinity());
    }
    at::Tensor row_max = std::get<0>(masked.max(1));
    tp.all_reduce(row_max, comm::ReduceOp::Max)->wait();
    at::Tensor exp = (masked - row_max.unsqueeze(1)).exp_();
    const at::Tensor local_target = targets - vocab_begin;
    const at::Tensor valid = targets != ignore_index;
    const at::Tensor here = valid & (local_target >= 0) & (local_target < real);
    const at::Tensor index = local_target.clamp(0, local - 1).unsqueeze(1);
    // where, not a product: a target on another rank may gather a padding column's -inf here.
    const at::Tensor target_logit =
        at::where(here, masked.gather(1, index).squeeze(1) - row_max, at::zeros_like(row_max));
    at::Tensor packed = at::stack({exp.sum(1), target_logit});
    tp.all_reduce(packed, comm::ReduceOp::Sum)->wait();
    const at::Tensor losses = (packed[0].log() - packed[1]) * valid;
    exp.div_(packed[0].unsqueeze(1));  // the softmax, kept for backward
    ctx->save_for_backward({exp, index, here, valid});
    return losses.sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0];  // softmax - one-hot(target), scaled; in place: backward runs once
    const at::Tensor& index = saved[1];
    grad.scatter_add_(1, index, -saved[2].to(grad.scalar_type()).unsqueeze(1));
    grad.mul_((saved[3].to(grad.scalar_type()) * grads[0]).unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_begin,
                                            int64_t vocab_end, int64_t ignore_index, comm::Communicator& tp) {
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_begin, vocab_end, ignore_index,
                                          c10::make_intrusive<GroupHandle>(&tp));
}

}  // namespace trainer::parallel
