#include "model/linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>

#include "model/fused_kernels.h"
#include "model/fused_ops.h"
#include "model/weight_use.h"
#include "parallel/tensor/group_handle.h"

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using detail::WeightHandle;
using detail::WeightUse;
using detail::handle_of;

struct Vocabulary {
  int64_t begin = 0;   // global id of the first local weight row
  int64_t real = 0;    // local rows that are real ids (the rest is padding)
  int64_t ignore = -100;
};

// One chunk's targets seen from this rank: which rows count, which hold their target here, and
// the local column of that target (clamped where it is not here).
struct ChunkTargets {
  at::Tensor valid, here, column;
  ChunkTargets(const at::Tensor& targets, const Vocabulary& v) {
    const at::Tensor local = targets - v.begin;
    valid = targets != v.ignore;
    here = valid & (local >= 0) & (local < v.real);
    column = local.clamp(0, std::max<int64_t>(v.real - 1, 0)).unsqueeze(1);
  }
};

// This chunk's logits, at least fp32, over the real local ids: [rows, real].
at::Tensor chunk_logits(const at::Tensor& h, const at::Tensor& weight, c10::ScalarType fp) {
  return h.mm(weight.t()).to(fp);
}

// The gradient of the loss sum with respect to the logits of `weight`'s rows (global ids
// [v.begin, v.begin + v.real)), scaled by `scale`, in the model dtype: (softmax - one-hot(target))
// for counted rows, zero for ignored ones.
at::Tensor chunk_logit_grad(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& lse,
                            const at::Tensor& targets, const Vocabulary& v, const at::Tensor& scale) {
  at::Tensor g = chunk_logits(h, weight, lse.scalar_type());
  g.sub_(lse.unsqueeze(1)).exp_();
  const ChunkTargets t(targets, v);
  if (v.real > 0) g.scatter_add_(1, t.column, -t.here.to(g.scalar_type()).unsqueeze(1));
  g.mul_((t.valid.to(g.scalar_type()) * scale).unsqueeze(1));
  return g.to(h.scalar_type());
}

// chunk_logit_grad by kernels/cross_entropy: the logits stay in the model dtype and become their
// gradient in place. all: the targets of every row; coef: valid * scale per row (fp32).
at::Tensor fused_chunk_logit_grad(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& lse,
                                  const ChunkTargets& all, const at::Tensor& coef, int64_t first_column) {
  at::Tensor g = h.mm(weight.t());
  const at::Tensor col = all.column.squeeze(1) - first_column;
  const at::Tensor column = at::where(all.here & (col >= 0) & (col < weight.size(0)), col, -1);
  fused::cross_entropy_logit_grad_(g, lse, column, coef);
  return g;
}

// out += a.mm(b): by the GEMM in fp32 when `fused_accumulation` can take it (fp32 out, bf16 a, b).
void add_product(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool fused_accumulation) {
  if (a.scalar_type() == out.scalar_type())
    out.addmm_(a, b);
  else if (fused_accumulation && out.is_cuda() && out.scalar_type() == at::kFloat && a.scalar_type() == at::kBFloat16)
    fused::add_mm_(out, a, b);
  else
    out.add_(a.mm(b));
}

// One pass over slices of the vocabulary, each slice's logits for all rows computed again and
// turned into the slice's rows of the weight gradient (when `weight`: one GEMM, written once)
// and its part of the input gradient (into *grad_h, when given; summed over the slices in fp32 at
// least, then cast to the model dtype). The weight gradient goes into the parameter with one
// accumulate_gradient (the gradient buckets count one contribution per use): into main_grad
// directly when installed.
void backward_by_slices(Parameter& p, const at::Tensor& h, const at::Tensor& lse, const at::Tensor& targets,
                        const Vocabulary& v, const at::Tensor& scale, int64_t slice_rows, at::Tensor* grad_h,
                        bool weight, const FusedKernels& kernels) {
  at::NoGradGuard no_grad;
  const WeightUse use(p);
  if (weight && p.grad_buffer) p.grad_buffer();
  at::Tensor into = weight ? (p.main_grad.defined() ? p.main_grad : at::zeros_like(use.get())) : at::Tensor();
  // The input gradient's sum: h's dtype when that is already fp32 or wider (summed by addmm_ in
  // place), else fp32 beside it.
  at::Tensor sum_h;
  if (grad_h) sum_h = at::zeros_like(h, h.options().dtype(lse.scalar_type()));
  const bool use_kernel = kernels.cross_entropy && fusable(h);
  std::optional<ChunkTargets> all;
  at::Tensor coef;
  if (use_kernel) {
    all.emplace(targets, v);
    coef = (all->valid.to(at::kFloat) * scale).contiguous();
  }
  for (int64_t s = 0; s < v.real; s += slice_rows) {
    const int64_t c = std::min(slice_rows, v.real - s);
    const at::Tensor w = use.get().narrow(0, s, c);
    const Vocabulary slice{v.begin + s, c, v.ignore};
    const at::Tensor g = use_kernel ? fused_chunk_logit_grad(h, w, lse, *all, coef, s)
                                    : chunk_logit_grad(h, w, lse, targets, slice, scale);  // [rows, c]
    if (grad_h) add_product(sum_h, g, w, kernels.grad_accumulation);
    if (weight) {
      at::Tensor rows = into.narrow(0, s, c);
      add_product(rows, g.t(), h, kernels.grad_accumulation);
    }
  }
  if (grad_h) *grad_h = sum_h.scalar_type() == h.scalar_type() ? sum_h : sum_h.to(h.scalar_type());
  if (!weight) return;
  if (p.main_grad.defined()) {
    if (p.grad_ready) p.grad_ready();
  } else {
    accumulate_gradient(p, into);
  }
}

struct ChunkedLinearCrossEntropy : public torch::autograd::Function<ChunkedLinearCrossEntropy> {
  // `weight_leaf` (the parameter's tensor) makes the output require grad; never read.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle, const at::Tensor& targets, int64_t vocab_begin,
                            int64_t vocab_end, int64_t ignore_index, c10::intrusive_ptr<parallel::GroupHandle> tp,
                            int64_t chunk_rows, bool fused_cross_entropy, bool fused_accumulation) {
    (void)weight_leaf;
    const WeightUse use(*handle->params[0]);
    const int64_t local = use.get().size(0);
    const Vocabulary v{vocab_begin, std::clamp<int64_t>(vocab_end - vocab_begin, 0, local), ignore_index};
    const at::Tensor weight = use.get().narrow(0, 0, v.real);
    const auto fp = at::promote_types(h.scalar_type(), at::kFloat);
    const int64_t n = h.size(0);
    at::Tensor lse = at::empty({n}, h.options().dtype(fp));
    at::Tensor total = at::zeros({}, h.options().dtype(fp));
    const bool use_kernel = fused_cross_entropy && fusable(h) && v.real > 0;
    for (int64_t s = 0; s < n; s += chunk_rows) {
      const int64_t c = std::min(chunk_rows, n - s);
      if (use_kernel) {
        // The same statistics from the logits in the model dtype; sums of exponentials relative
        // to this rank's maximum, rescaled to the maximum over tp before they are summed.
        const at::Tensor logits = h.narrow(0, s, c).mm(weight.t());
        const ChunkTargets t(targets.narrow(0, s, c), v);
        const auto stats = fused::cross_entropy_row_stats(logits, at::where(t.here, t.column.squeeze(1), -1));
        at::Tensor row_max = stats.max;
        at::Tensor packed = at::stack({stats.sum_exp, stats.target_logit});
        if (tp) {
          at::Tensor global_max = row_max.clone();
          tp->group->all_reduce(global_max, comm::ReduceOp::Max)->wait();
          packed[0].mul_((row_max - global_max).exp_());
          row_max = global_max;
          tp->group->all_reduce(packed, comm::ReduceOp::Sum)->wait();
        }
        const at::Tensor lse_c = row_max + packed[0].log();
        lse.narrow(0, s, c).copy_(lse_c);
        total.add_(at::where(t.valid, lse_c - packed[1], at::zeros_like(lse_c)).sum());
        continue;
      }
      const at::Tensor logits = chunk_logits(h.narrow(0, s, c), weight, fp);
      const ChunkTargets t(targets.narrow(0, s, c), v);
      at::Tensor row_max = v.real > 0 ? std::get<0>(logits.max(1))
                                      : at::full({c}, -std::numeric_limits<double>::infinity(), logits.options());
      if (tp) tp->group->all_reduce(row_max, comm::ReduceOp::Max)->wait();
      // Sums of exponentials and the target logits (held by one rank of tp) in one reduction.
      at::Tensor packed = at::zeros({2, c}, logits.options());
      if (v.real > 0) {
        packed[0].copy_((logits - row_max.unsqueeze(1)).exp_().sum(1));
        packed[1].copy_(at::where(t.here, logits.gather(1, t.column).squeeze(1), at::zeros_like(row_max)));
      }
      if (tp) tp->group->all_reduce(packed, comm::ReduceOp::Sum)->wait();
      const at::Tensor lse_c = row_max + packed[0].log();
      lse.narrow(0, s, c).copy_(lse_c);
      total.add_(at::where(t.valid, lse_c - packed[1], at::zeros_like(lse_c)).sum());
    }
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    // Backward's slices follow the local rows, padding included, as the forward chunks and the
    // estimator's replay do.
    ctx->saved_data["vocab"] = std::vector<int64_t>{v.begin, v.real, v.ignore, counting::loss_vocab_slice(local, h.size(1))};
    ctx->saved_data["fused_cross_entropy"] = fused_cross_entropy;
    ctx->saved_data["fused_accumulation"] = fused_accumulation;
    ctx->save_for_backward({h, targets, lse});
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    Parameter& p = *handle->params[0];
    const std::vector<int64_t> meta = ctx->saved_data["vocab"].toIntVector();
    const Vocabulary v{meta[0], meta[1], meta[2]};
    const int64_t slice_rows = meta[3];
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &h = saved[0], &targets = saved[1], &lse = saved[2];
    const at::Tensor scale = grads[0].to(lse.scalar_type());
    FusedKernels kernels;
    kernels.cross_entropy = ctx->saved_data["fused_cross_entropy"].toBool();
    kernels.grad_accumulation = ctx->saved_data["fused_accumulation"].toBool();
    // The weight's gradient in the same pass as the input's, unless zero-bubble defers it: then
    // its own pass later, computing the slices' logits once more.
    const bool weight = ctx->needs_input_grad(1);
    const bool defer = weight && handle->queue && handle->queue->deferring();
    at::Tensor grad_h;
    if (ctx->needs_input_grad(0) || (weight && !defer))
      backward_by_slices(p, h, lse, targets, v, scale, slice_rows, ctx->needs_input_grad(0) ? &grad_h : nullptr,
                         weight && !defer, kernels);
    if (defer)
      handle->queue->submit([&p, h, lse, targets, v, scale, slice_rows, kernels] {
        backward_by_slices(p, h, lse, targets, v, scale, slice_rows, nullptr, true, kernels);
      });
    return {grad_h, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

}  // namespace

at::Tensor linear_cross_entropy_sum(const at::Tensor& h, Parameter& weight, WeightGradQueue* queue,
                                    const at::Tensor& targets, int64_t vocab_begin, int64_t vocab_end,
                                    int64_t ignore_index, comm::Communicator* tp, int64_t chunk_rows,
                                    const FusedKernels& kernels) {
  if (h.dim() != 2 || targets.dim() != 1 || targets.size(0) != h.size(0))
    throw std::logic_error("linear_cross_entropy_sum: h must be [N, H] and targets [N]");
  if (chunk_rows < 1) throw std::logic_error("linear_cross_entropy_sum: chunk_rows must be at least 1");
  const bool split = tp && tp->size() > 1;
  return ChunkedLinearCrossEntropy::apply(
      h, weight.tensor, c10::make_intrusive<WeightHandle>(std::vector<Parameter*>{&weight}, queue), targets,
      vocab_begin, vocab_end, ignore_index,
      split ? c10::make_intrusive<parallel::GroupHandle>(tp) : c10::intrusive_ptr<parallel::GroupHandle>(), chunk_rows,
      kernels.cross_entropy, kernels.grad_accumulation);
}

}  // namespace trainer::model
