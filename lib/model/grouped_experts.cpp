#include "model/grouped_experts.h"

#include "model/tensor_storage.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <array>
#include <deque>
#include <numeric>
#include <stdexcept>

#include "model/parallel_linear.h"
#include "model/weight_use.h"

namespace trainer::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using detail::WeightHandle;
using detail::WeightUse;
using detail::handle_of;
using detail::weight_gradient;

// One projection of the local experts for one use: each expert's weight, and the stacked
// [E, out, in] tensor when the grouped GEMM needs it (a view when the experts' weights lie in order
// in one storage, as the constructor builds them; a copy when ZeRO-1 moved them into its buckets
// or ZeRO-3 gathered them).
struct ProjectionUse {
  std::deque<WeightUse> uses;
  std::vector<at::Tensor> each;
  at::Tensor stacked;

  ProjectionUse(const std::vector<Parameter*>& params, bool want_stacked) {
    for (Parameter* p : params) each.push_back(uses.emplace_back(*p).get());
    if (!want_stacked) return;
    const at::Tensor& first = each.front();
    bool in_order = true;
    for (size_t e = 0; e < each.size() && in_order; ++e)
      in_order = each[e].is_contiguous() && each[e].is_alias_of(first) &&
                 each[e].storage_offset() == first.storage_offset() + int64_t(e) * first.numel();
    const int64_t rows = first.size(0), cols = first.size(1);
    stacked = in_order ? first.as_strided({int64_t(each.size()), rows, cols}, {rows * cols, cols, 1}) : at::stack(each);
  }
};

// The rows of group e times b_e, for groups of `lengths` consecutive rows of `a` [N, k]; b_e is
// [k, n] (`transposed`: each[e] is [n, k] and its transpose is used). Returns [N, n].
at::Tensor grouped_mm(const at::Tensor& a, const ProjectionUse& b, bool transposed, const std::vector<int64_t>& lengths,
                      const at::Tensor& offsets) {
  if (offsets.defined()) return at::_grouped_mm(a, transposed ? b.stacked.transpose(1, 2) : b.stacked, offsets);
  const int64_t n = transposed ? b.each.front().size(0) : b.each.front().size(1);
  at::Tensor out = at::empty({a.size(0), n}, a.options());
  int64_t start = 0;
  for (size_t e = 0; e < lengths.size(); ++e) {
    if (lengths[e] > 0) {
      at::Tensor piece = out.narrow(0, start, lengths[e]);
      at::mm_out(piece, a.narrow(0, start, lengths[e]), transposed ? b.each[e].t() : b.each[e]);
    }
    start += lengths[e];
  }
  return out;
}

// Per group e: g_e^T x_e ([n, k] for g [N, n], x [N, k]), the weight gradient of every expert
// (zero for an expert without rows), handed to `use` one at a time.
template <typename F>
void for_each_weight_grad(const at::Tensor& g, const at::Tensor& x, const std::vector<int64_t>& lengths,
                          const at::Tensor& offsets, F&& use) {
  if (offsets.defined()) {
    const at::Tensor all = at::_grouped_mm(g.t(), x, offsets);
    for (size_t e = 0; e < lengths.size(); ++e) use(e, all[int64_t(e)]);
    return;
  }
  int64_t start = 0;
  for (size_t e = 0; e < lengths.size(); ++e) {
    const int64_t len = lengths[e];
    use(e, len > 0 ? g.narrow(0, start, len).t().mm(x.narrow(0, start, len)) : at::zeros({g.size(1), x.size(1)}, g.options()));
    start += len;
  }
}

// The handle's parameters (w1 of every local expert, then w3, then w2) by projection.
std::array<std::vector<Parameter*>, 3> projections(const std::vector<Parameter*>& ps, size_t experts) {
  const auto at = [&](size_t k) { return ps.begin() + long(k * experts); };
  return {std::vector<Parameter*>(at(0), at(1)), std::vector<Parameter*>(at(1), at(2)),
          std::vector<Parameter*>(at(2), ps.end())};
}

struct GroupedSwiglu : public torch::autograd::Function<GroupedSwiglu> {
  // handle->params: w1 of every local expert, then w3, then w2. `weight_leaf` (the first w1) is
  // passed so that the output requires grad; never read.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& weight_leaf,
                            c10::intrusive_ptr<WeightHandle> handle, std::vector<int64_t> lengths, bool aten) {
    (void)weight_leaf;
    const auto [w1, w3, w2] = projections(handle->params, lengths.size());
    const at::Tensor offsets = aten ? offsets_of(lengths, rows.device()) : at::Tensor();
    at::Tensor h1, h3;
    {
      const ProjectionUse gate(w1, aten), up(w3, aten);
      h1 = grouped_mm(rows, gate, true, lengths, offsets);
      h3 = grouped_mm(rows, up, true, lengths, offsets);
    }
    const ProjectionUse down(w2, aten);
    const at::Tensor out = grouped_mm(at::silu(h1) * h3, down, true, lengths, offsets);
    ctx->saved_data["weight"] = c10::IValue::make_capsule(handle);
    ctx->saved_data["lengths"] = lengths;
    ctx->saved_data["aten"] = aten;
    ctx->save_for_backward({rows, h1, h3});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto handle = handle_of(ctx);
    const std::vector<int64_t> lengths = ctx->saved_data["lengths"].toIntVector();
    const bool aten = ctx->saved_data["aten"].toBool();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor rows = saved[0], h1 = saved[1], h3 = saved[2];
    const at::Tensor go = grads[0].contiguous();
    const auto [w1, w3, w2] = projections(handle->params, lengths.size());
    const at::Tensor offsets = aten ? offsets_of(lengths, rows.device()) : at::Tensor();

    at::Tensor da;
    {
      const ProjectionUse down(w2, aten);
      da = grouped_mm(go, down, false, lengths, offsets);
    }
    // silu(h1) * h3 differentiated as autograd would (the same kernels).
    auto [dh1, dh3] = swiglu_backward(da, h1, h3);
    da.reset();
    at::Tensor grad_rows;
    if (ctx->needs_input_grad(0)) {
      const ProjectionUse gate(w1, aten), up(w3, aten);
      grad_rows = grouped_mm(dh1, gate, false, lengths, offsets);
      grad_rows.add_(grouped_mm(dh3, up, false, lengths, offsets));
    }
    if (ctx->needs_input_grad(1))
      weight_gradient(handle->queue, [go, h1, h3, dh1 = dh1, dh3 = dh3, rows, lengths, offsets, w1, w3, w2] {
        // One projection at a time, each expert's gradient added as it is computed; the product
        // silu(h1) * h3 computed again for the down projection's.
        for_each_weight_grad(go, at::silu(h1) * h3, lengths, offsets, [&](size_t e, const at::Tensor& g) { accumulate_gradient(*w2[e], g); });
        for_each_weight_grad(dh1, rows, lengths, offsets, [&](size_t e, const at::Tensor& g) { accumulate_gradient(*w1[e], g); });
        for_each_weight_grad(dh3, rows, lengths, offsets, [&](size_t e, const at::Tensor& g) { accumulate_gradient(*w3[e], g); });
      });
    return {grad_rows, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

  // at::_grouped_mm's group ends: int32 cumulative row counts on the rows' device.
  static at::Tensor offsets_of(const std::vector<int64_t>& lengths, const at::Device& device) {
    std::vector<int32_t> ends(lengths.size());
    int64_t total = 0;
    for (size_t e = 0; e < lengths.size(); ++e) ends[e] = int32_t(total += lengths[e]);
    return at::tensor(ends, at::kInt).to(device);
  }
};

// at::_grouped_mm reads rows and weights with strides that must be multiples of 16 bytes.
bool aligned(int64_t elements, const at::Tensor& like) { return elements * int64_t(like.element_size()) % 16 == 0; }

}  // namespace

GroupedExperts::GroupedExperts(ParameterSet& params, const std::string& prefix, int64_t first, int64_t count,
                               int64_t hidden, int64_t intermediate, ExpertTensorParallel etp, GroupedGemm gemm)
    : queue_(&params.weight_grads()), gemm_(gemm) {
  if (etp.size > 1 && !etp.group)
    throw std::logic_error(fmt::format("{}: experts split etp = {} ways without an etp group", prefix, etp.size));
  // Each weight is created (and initialised) by its own name; its tensor then becomes row e of
  // the projection's stacked tensor.
  const auto sharded = [&](int64_t dim) {
    return etp.size > 1 ? std::vector<ShardSpec>{ShardSpec::even(dim, intermediate, etp.rank, etp.size, mesh::GroupKind::Etp)}
                        : std::vector<ShardSpec>{};
  };
  for (int64_t e = first; e < first + count; ++e) {
    const std::string name = fmt::format("{}{}.", prefix, e);
    w1_.push_back(&params.create(name + "w1.weight", {intermediate, hidden}, InitKind::Normal, sharded(0)));
    w3_.push_back(&params.create(name + "w3.weight", {intermediate, hidden}, InitKind::Normal, sharded(0)));
    w2_.push_back(&params.create(name + "w2.weight", {hidden, intermediate}, InitKind::Normal, sharded(1)));
    for (Parameter* p : {w1_.back(), w3_.back(), w2_.back()}) p->layer_matrix = true;
  }
  // Deferred parameters (ZeRO-3) have no values yet; their buckets place them.
  if (!has_storage(w1_.front()->tensor)) return;
  at::NoGradGuard no_grad;
  for (auto* projection : {&w1_, &w3_, &w2_}) {
    std::vector<at::Tensor> each;
    for (Parameter* p : *projection) each.push_back(p->tensor.detach());
    const at::Tensor stacked = at::stack(each);
    for (size_t e = 0; e < projection->size(); ++e) (*projection)[e]->tensor.set_data(stacked[int64_t(e)]);
  }
}

bool GroupedExperts::uses_grouped_mm(const at::Tensor& rows) const {
  if (gemm_ == GroupedGemm::Loop || rows.numel() == 0) return false;
  const int64_t width = w1_.front()->tensor.size(0), hidden = w1_.front()->tensor.size(1);
  const bool runs = aligned(width, rows) && aligned(hidden, rows) &&
                    rows.scalar_type() == (rows.is_cuda() ? at::kBFloat16 : at::kFloat);
  return runs && (gemm_ == GroupedGemm::Aten || rows.is_cuda());
}

at::Tensor GroupedExperts::forward(const at::Tensor& rows, const std::vector<int64_t>& lengths) const {
  if (int64_t(lengths.size()) != count())
    throw std::logic_error(fmt::format("grouped experts: {} group lengths for {} experts", lengths.size(), count()));
  if (gemm_ == GroupedGemm::Aten && rows.numel() > 0 && !uses_grouped_mm(rows))
    throw std::logic_error("grouped experts: at::_grouped_mm cannot run these rows (dtype, device or alignment)");
  std::vector<Parameter*> all = w1_;
  all.insert(all.end(), w3_.begin(), w3_.end());
  all.insert(all.end(), w2_.begin(), w2_.end());
  return GroupedSwiglu::apply(rows, w1_.front()->tensor, c10::make_intrusive<WeightHandle>(all, queue_), lengths,
                              uses_grouped_mm(rows));
}

}  // namespace trainer::model
