#include "engine/replicas.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace trainer::engine {

namespace {

ReplicaSet make_set(const mesh::RankLayout& layout, int64_t rank, std::vector<int64_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ReplicaSet set;
  set.position = std::find(ranks.begin(), ranks.end(), rank) - ranks.begin();
  for (const mesh::GroupKind kind : mesh::all_group_kinds()) {
    std::vector<int64_t> members = layout.group(kind, rank);
    std::sort(members.begin(), members.end());
    if (members == ranks) {
      set.name = mesh::group_kind_name(kind);
      break;
    }
  }
  if (set.name.empty()) set.name = fmt::format("ranks {}", fmt::join(ranks, ","));
  set.ranks = std::move(ranks);
  return set;
}

bool same_slice(const mesh::RankLayout& layout, int64_t a, int64_t b, const model::Parameter& p) {
  if (p.expert && layout.index_in(mesh::GroupKind::Ep, a) != layout.index_in(mesh::GroupKind::Ep, b)) return false;
  for (const auto& s : p.shards)
    if (layout.index_in(s.group, a) != layout.index_in(s.group, b)) return false;
  return true;
}

}  // namespace

ReplicaSet parameter_replicas(const mesh::RankLayout& layout, int64_t rank, const model::Parameter& p) {
  std::vector<int64_t> ranks;
  // A tied embedding split across the pipeline has copies on both ends: the stages of the
  // embedding group.
  const std::vector<int64_t> ends =
      p.tied_across_stages ? layout.group(mesh::GroupKind::Embedding, rank) : std::vector<int64_t>{rank};
  for (const int64_t end : ends)
    for (const int64_t r : layout.group(mesh::GroupKind::TpDpCp, end))
      if (same_slice(layout, rank, r, p)) ranks.push_back(r);
  return make_set(layout, rank, std::move(ranks));
}

ReplicaSet shard_replicas(const mesh::RankLayout& layout, int64_t rank, const model::Parameter& p,
                          mesh::GroupKind group) {
  const int64_t part = layout.index_in(group, rank);
  std::vector<int64_t> ranks;
  for (const int64_t r : parameter_replicas(layout, rank, p).ranks)
    if (layout.index_in(group, r) == part) ranks.push_back(r);
  return make_set(layout, rank, std::move(ranks));
}

ReplicaSet world_replicas(const mesh::RankLayout& layout, int64_t rank) {
  ReplicaSet set;
  for (int64_t r = 0; r < layout.world_size(); ++r) set.ranks.push_back(r);
  set.position = rank;
  set.name = "world";
  return set;
}

ReplicaSet stage_replicas(const mesh::RankLayout& layout, int64_t rank) {
  return make_set(layout, rank, layout.group(mesh::GroupKind::TpDpCp, rank));
}

ReplicaSet holder_replicas(const mesh::RankLayout& layout, int64_t rank, const model::Parameter& p) {
  if (!p.expert) return stage_replicas(layout, rank);
  std::vector<int64_t> ranks;
  for (const int64_t r : layout.group(mesh::GroupKind::TpDpCp, rank))
    if (layout.index_in(mesh::GroupKind::Ep, r) == layout.index_in(mesh::GroupKind::Ep, rank)) ranks.push_back(r);
  return make_set(layout, rank, std::move(ranks));
}

checkpoint::TensorRecord::Replication as_replication(const ReplicaSet& set) {
  return {set.name, set.position, int64_t(set.ranks.size())};
}

}  // namespace trainer::engine
