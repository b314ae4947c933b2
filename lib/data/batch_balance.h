#pragma once
// Balanced packing (data.balance "cost", with document masking): the samples of a global batch
// are fixed (DESIGN.md invariant 2: the loss, the data order and a resume do not change), but
// which data-parallel rank and which of its micro-batches processes each sample is chosen by its
// work. Every sample has seq_len tokens, so the linear work (projections, MLP, head) is the same
// for each and every rank gets the same number of samples: only the attention work differs, which
// with documents masked is proportional to the sum of the squares of the sample's document lengths
// (data/documents.h). The assignment is greedy longest-first (LPT) with equal counts: items in
// decreasing cost, each to the group with the least work so far that still has room; first the
// samples into the global batch's micro-batches (which samples share a micro-batch does not depend
// on the mesh, so a MoE layer's per-micro-batch auxiliary loss and capacity see the same tokens
// together on every mesh), then the micro-batches over the data-parallel ranks. A pure function of
// the costs: every rank computes the same plan, and a resume the same as the run it resumes.
// Torch-free.
#include <cstdint>
#include <vector>

namespace trainer::data {

// `costs` of n items into `groups` groups of n / groups items each (n divisible by groups):
// each group's item indices, increasing. Ties go to the lower index and the lower group.
std::vector<std::vector<int64_t>> balance_equal_groups(const std::vector<double>& costs, int64_t groups);

// The global batch's G = dp * accumulation * micro_batch_size samples (costs[i] of its i-th
// sample) -> plan[r][m]: the offsets in the global batch (0 .. G-1, increasing) of rank r's
// micro-batch m. Without `balance`: the contiguous split (rank r, micro-batch m reads offsets
// (r * accumulation + m) * micro_batch_size onwards), as without masking.
using GlobalBatchPlan = std::vector<std::vector<std::vector<int64_t>>>;
GlobalBatchPlan plan_global_batch(const std::vector<double>& costs, int64_t dp, int64_t accumulation,
                                  int64_t micro_batch_size, bool balance);

// Each rank's work under `plan` (the sum of its samples' costs).
std::vector<double> rank_loads(const GlobalBatchPlan& plan, const std::vector<double>& costs);

// max / mean of `loads` (1 when they are all zero).
double max_over_mean(const std::vector<double>& loads);

}  // namespace trainer::data
