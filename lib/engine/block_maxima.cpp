#include "engine/block_maxima.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "optim/state_layout.h"

namespace trainer::engine {

namespace {
// The shard spec splitting p's last dimension, or null.
const model::ShardSpec* row_split(const model::Parameter& p) {
  for (const auto& s : p.shards)
    if (s.dim == int64_t(p.global_shape.size()) - 1 && p.global_shape.size() >= 2) return &s;
  return nullptr;
}
}  // namespace

bool splits_rows(const model::Parameter& p) {
  return row_split(p) && p.global_shape.back() <= optim::kQuantBlock && p.tensor.size(-1) < p.global_shape.back();
}

void reduce_split_rows(const mesh::ProcessGroups& groups, const std::vector<const model::Parameter*>& owners,
                       std::vector<at::Tensor>& maxima) {
  std::map<mesh::GroupKind, std::vector<size_t>> by_group;
  for (size_t i = 0; i < owners.size(); ++i)
    if (maxima[i].defined() && splits_rows(*owners[i])) by_group[row_split(*owners[i])->group].push_back(i);
  for (const auto& [kind, members] : by_group) {
    std::vector<at::Tensor> parts;
    for (size_t i : members) parts.push_back(maxima[i].reshape({-1}));
    at::Tensor all = at::cat(parts);
    groups.get(kind).all_reduce(all, comm::ReduceOp::Max)->wait();
    int64_t at = 0;
    for (size_t i : members) {
      maxima[i].view({-1}).copy_(all.narrow(0, at, maxima[i].numel()));
      at += maxima[i].numel();
    }
  }
}

CutBlocks::CutBlocks(const GradBuckets& buckets, const std::deque<model::Parameter>& params,
                     const std::function<bool(size_t param)>& quantized) {
  if (!params.empty()) device_ = params.front().tensor.device();
  const auto& all = buckets.buckets();
  cut_.resize(all.size());
  for (size_t b = 0; b < all.size(); ++b) {
    const auto& bucket = all[b];
    const int64_t ranks = bucket.comm->size(), shard = GradBuckets::shard_numel(bucket);
    for (int64_t k = 1; k < ranks; ++k) {
      const int64_t at = k * shard;
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        const size_t param = bucket.params[i];
        const int64_t begin = bucket.offsets[i], numel = params[param].tensor.numel();
        if (at <= begin || at >= begin + numel || !quantized(param)) continue;
        const optim::BlockGrid grid = optim::BlockGrid::of_row_length(params[param].tensor.size(-1));
        const int64_t block = grid.block_of(at - begin);
        if (grid.block_begin(block) < at - begin) cut_[b].emplace_back(param, block);
      }
    }
    std::sort(cut_[b].begin(), cut_[b].end());
    cut_[b].erase(std::unique(cut_[b].begin(), cut_[b].end()), cut_[b].end());
  }
}

bool CutBlocks::empty() const {
  return std::all_of(cut_.begin(), cut_.end(), [](const auto& c) { return c.empty(); });
}

void CutBlocks::reduce(GradBuckets& buckets, const std::vector<Fragment>& fragments,
                       std::vector<at::Tensor>& maxima) const {
  for (size_t b = 0; b < cut_.size(); ++b) {
    const auto& cut = cut_[b];
    if (cut.empty()) continue;
    // Column j: block cut[j]'s maxima of the first and second moment over this rank's part.
    at::Tensor shared = at::zeros({2, int64_t(cut.size())}, at::TensorOptions().dtype(at::kFloat).device(device_));
    // (fragment index, column in its maxima, column in `shared`) of each cut block this rank holds.
    std::vector<std::tuple<size_t, int64_t, int64_t>> mine;
    for (size_t f = 0; f < fragments.size(); ++f) {
      const Fragment& fr = fragments[f];
      if (fr.bucket != b || !maxima[f].defined()) continue;
      const optim::BlockGrid grid = fr.geometry->grid();
      const int64_t first = grid.first_block(fr.geometry->offset);
      const int64_t last = grid.block_of(fr.geometry->offset + fr.geometry->length - 1);
      for (const int64_t block : {first, last}) {
        const auto it = std::lower_bound(cut.begin(), cut.end(), std::make_pair(fr.param, block));
        if (it == cut.end() || *it != std::make_pair(fr.param, block)) continue;
        const int64_t column = it - cut.begin();
        mine.emplace_back(f, block - first, column);
        shared.select(1, column).copy_(at::maximum(shared.select(1, column), maxima[f].select(1, block - first)));
      }
    }
    // Every rank of the group takes part, holding a cut block or not.
    buckets.buckets()[b].comm->all_reduce(shared, comm::ReduceOp::Max)->wait();
    for (const auto& [f, column_in_piece, column] : mine)
      maxima[f].select(1, column_in_piece).copy_(shared.select(1, column));
  }
}

}  // namespace trainer::engine
