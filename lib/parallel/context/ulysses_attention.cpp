#include "parallel/context/ulysses_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <stdexcept>

#include "parallel/context/causal_sdpa.h"
#include "parallel/context/zigzag.h"
#include "parallel/tensor/group_handle.h"

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Equal splits along dim 0 of [cp, ...]: part j goes to rank j, part j of the output came from rank j.
at::Tensor exchange(const at::Tensor& parts, comm::Communicator& cp) {
  at::Tensor input = parts.contiguous();
  at::Tensor output = at::empty_like(input);
  const std::vector<int64_t> splits(size_t(cp.size()), parts.size(0) / cp.size());
  cp.all_to_all(output, input, splits, splits)->wait();
  return output;
}

// [B, h, L, d] (sequence part, all heads) -> [B, h / cp, T, d] (whole sequence, head group r).
at::Tensor to_heads(const at::Tensor& x, comm::Communicator& cp) {
  const int64_t n = cp.size();
  // [cp (head group), B, h / cp, L, d]: head group j goes to rank j.
  const at::Tensor parts = x.unflatten(1, {n, x.size(1) / n}).transpose(0, 1);
  // [cp (source rank), B, h / cp, L, d]: every rank's sequence part of this rank's heads.
  return zigzag_assemble(exchange(parts, cp), /*dim=*/2);
}

// [B, h / cp, T, d] -> [B, h, L, d].
at::Tensor to_sequence(const at::Tensor& x, comm::Communicator& cp) {
  const int64_t n = cp.size();
  // [cp (destination rank), B, h / cp, L, d]: rank j's sequence part of this rank's heads.
  const at::Tensor received = exchange(zigzag_split(x, /*dim=*/2, n), cp);
  // [cp (head group), B, h / cp, L, d] -> [B, h, L, d].
  return received.transpose(0, 1).flatten(1, 2);
}

struct UlyssesExchange : public torch::autograd::Function<UlyssesExchange> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupHandle> group,
                            bool to_heads_direction) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["to_heads"] = to_heads_direction;
    return to_heads_direction ? to_heads(x, *group->group) : to_sequence(x, *group->group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    const bool forward_to_heads = ctx->saved_data["to_heads"].toBool();
    const at::Tensor g = forward_to_heads ? to_sequence(grads[0], *group->group) : to_heads(grads[0], *group->group);
    return {g, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sequence_to_heads(const at::Tensor& x, comm::Communicator& cp) {
  if (cp.size() == 1) return x;
  return UlyssesExchange::apply(x, c10::make_intrusive<GroupHandle>(&cp), true);
}

at::Tensor heads_to_sequence(const at::Tensor& x, comm::Communicator& cp) {
  if (cp.size() == 1) return x;
  return UlyssesExchange::apply(x, c10::make_intrusive<GroupHandle>(&cp), false);
}

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& cp,
                             int64_t window, const at::Tensor& documents) {
  const int64_t n = cp.size(), heads = q.size(1), kv_heads = k.size(1);
  if (heads % n != 0 || heads % kv_heads != 0)
    throw std::invalid_argument(fmt::format(
        "Ulysses attention: {} query heads must be a multiple of cp = {} and of the {} key/value heads", heads, n,
        kv_heads));
  // Repeating each kv head cp / gcd(kv, cp) times gives lcm(kv, cp) heads, a multiple of cp whose
  // grouping still matches the query heads (heads divides by both kv and cp).
  const int64_t repeat = n / std::gcd(kv_heads, n);
  const at::Tensor k_all = repeat == 1 ? k : k.repeat_interleave(repeat, 1);
  const at::Tensor v_all = repeat == 1 ? v : v.repeat_interleave(repeat, 1);
  const at::Tensor q_heads = sequence_to_heads(q, cp), k_heads = sequence_to_heads(k_all, cp),
                   v_heads = sequence_to_heads(v_all, cp);
  // The whole sequence, in order, and so is documents'.
  const at::Tensor out = causal_sdpa(q_heads, k_heads, v_heads, window, documents);
  return heads_to_sequence(out, cp);
}

}  // namespace trainer::parallel
