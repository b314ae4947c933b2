#pragma once
// The maximum of an 8-bit block (optim/block_grid.h) over every rank holding part of it, so that
// each block is quantised by the same maximum on every mesh:
// - a ZeRO shard boundary inside a block: the two (or more) ranks of the bucket's group holding
//   parts of it (CutBlocks, from the bucket layout, the same on every rank of the group);
// - a last dimension of at most 256 columns split by tensor parallelism: each row is one block,
//   held in parts by every rank of the tp (or etp) group (reduce_split_rows).
// Maxima are exact: the result does not depend on the order of the reduction.
#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "engine/grad_buckets.h"
#include "mesh/process_groups.h"
#include "model/parameter.h"
#include "optim/update_rule.h"

namespace trainer::engine {

// Maxima of blocks that parameters split along their last dimension share across the group that
// splits it: maxima[i] (per-block maxima [2, blocks] of owners[i]'s piece, or undefined) become the
// maximum over that group. Every rank of the group passes the same parameters in the same order.
void reduce_split_rows(const mesh::ProcessGroups& groups, const std::vector<const model::Parameter*>& owners,
                       std::vector<at::Tensor>& maxima);

// Whether p's 8-bit blocks are shared across the group splitting its last dimension.
bool splits_rows(const model::Parameter& p);

// The blocks that shard boundaries cut in sharded gradient buckets.
class CutBlocks {
 public:
  // `quantized(param index)`: whether that parameter has block-wise state.
  CutBlocks(const GradBuckets& buckets, const std::deque<model::Parameter>& params,
            const std::function<bool(size_t param)>& quantized);
  // One piece per fragment of this rank: its bucket, parameter and geometry.
  struct Fragment {
    size_t bucket, param;
    const optim::PieceGeometry* geometry;
  };
  // Replaces the maxima of cut blocks at the ends of this rank's fragments by their maximum over the
  // bucket's group (one small all-reduce per bucket that has cut blocks).
  void reduce(GradBuckets& buckets, const std::vector<Fragment>& fragments, std::vector<at::Tensor>& maxima) const;
  bool empty() const;

 private:
  // Per bucket: the cut (parameter, block) pairs, sorted.
  std::vector<std::vector<std::pair<size_t, int64_t>>> cut_;
  at::Device device_ = at::Device(at::kCPU);
};

}  // namespace trainer::engine
