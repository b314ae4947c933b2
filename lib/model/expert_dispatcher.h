#pragma once
// Expert-parallel token dispatch: the token copies of a micro-batch, grouped by global expert, go
// to the ep ranks that hold their experts (an all-to-all with uneven splits, the counts exchanged
// first), the local experts run on what arrives (grouped by local expert, over the etp group when
// expert tensor parallelism splits each expert's width), and a second all-to-all brings the outputs
// back in the sender's order. Without expert parallelism the local experts run directly.
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "model/grouped_experts.h"
#include "model/layers.h"

namespace trainer::model {

class ExpertDispatcher {
 public:
  ExpertDispatcher() = default;
  // ep: this rank's place among the ranks that split the `num_experts` experts (E / ep.size
  // consecutive ones each).
  ExpertDispatcher(ExpertParallel ep, int64_t num_experts) : ep_(ep), num_experts_(num_experts) {}

  // The outputs of `experts` (this rank's) and of the other ranks' experts for `sorted`: copies
  // grouped by global expert, lengths[e] of expert e, in this rank's order; the result has the
  // same rows in the same order. `meanwhile` runs while the copies travel (the shared experts).
  // Inputs are taken by value so that each buffer is freed as soon as the next one exists.
  at::Tensor run(const GroupedExperts& experts, at::Tensor sorted, const std::vector<int64_t>& lengths,
                 const std::function<void()>& meanwhile) const;

 private:
  // The local experts on rows grouped by local expert, over the etp group when it splits them.
  at::Tensor run_local(const GroupedExperts& experts, at::Tensor rows, const std::vector<int64_t>& lengths) const;

  ExpertParallel ep_;
  int64_t num_experts_ = 0;
};

}  // namespace trainer::model
