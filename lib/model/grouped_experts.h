#pragma once
// The local experts of one MoE layer as grouped GEMMs (Megatron's GroupedMLP): rows sorted by
// expert go through every expert's SwiGLU in one call instead of a loop of small layers.
//
// Weights: each projection of the local experts is one stacked tensor [E_local, out, in] whose
// row e is expert (first + e)'s weight; the parameters keep Mixtral's per-expert names
// ("...experts.E.w1.weight", [I, H]) and are views of those rows, so checkpoints, Hugging Face
// export and the optimizer see the per-expert tensors. With expert tensor parallelism (etp > 1)
// each expert's intermediate width is split etp-ways (w1/w3 by rows, w2 by columns, shards over
// the etp group) and the output is a partial sum the caller reduces over etp.
//
// The GEMMs: at::_grouped_mm where it runs (bf16 on a GPU; fp32 on the CPU when every stride is a
// multiple of 16 bytes), otherwise one mm per expert over its rows (the CPU equivalent). Backward
// is one autograd function: the input gradient now, the weight gradients into the per-expert
// parameters (model::accumulate_gradient), deferred with the layer's WeightGradQueue.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "model/layers.h"
#include "model/parameter.h"

namespace trainer::model {

// How the grouped GEMMs run: Auto picks Aten where it runs (see above), else Loop.
enum class GroupedGemm { Auto, Loop, Aten };

class GroupedExperts {
 public:
  GroupedExperts() = default;
  // Registers w1/w3/w2 of experts [first, first + count) under `prefix` ("...experts.").
  GroupedExperts(ParameterSet& params, const std::string& prefix, int64_t first, int64_t count, int64_t hidden,
                 int64_t intermediate, ExpertTensorParallel etp, GroupedGemm gemm = GroupedGemm::Auto);
  // rows [sum(lengths), hidden] grouped by local expert (lengths[e] rows for expert first + e; zero
  // is fine). Returns [sum(lengths), hidden]: the experts' outputs (partial sums over etp when etp > 1).
  at::Tensor forward(const at::Tensor& rows, const std::vector<int64_t>& lengths) const;
  int64_t count() const { return int64_t(w1_.size()); }
  // Whether forward would use at::_grouped_mm for rows of this dtype and device.
  bool uses_grouped_mm(const at::Tensor& rows) const;

 private:
  std::vector<Parameter*> w1_, w3_, w2_;  // per local expert: gate [I_l, H], up [I_l, H], down [H, I_l]
  WeightGradQueue* queue_ = nullptr;
  GroupedGemm gemm_ = GroupedGemm::Auto;
};

}  // namespace trainer::model
