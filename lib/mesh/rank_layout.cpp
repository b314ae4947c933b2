#include "mesh/rank_layout.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace trainer::mesh {

const std::vector<GroupKind>& all_group_kinds() {
  static const std::vector<GroupKind> kinds = {GroupKind::Tp,   GroupKind::Cp,  GroupKind::Dp,  GroupKind::Pp,
                                               GroupKind::DpCp, GroupKind::TpCp, GroupKind::TpDpCp, GroupKind::Ep, GroupKind::Etp,
                                               GroupKind::Edp,  GroupKind::Embedding, GroupKind::DpCpShard,
                                               GroupKind::DpCpReplicate};
  return kinds;
}

std::string group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::Tp: return "tp";
    case GroupKind::Cp: return "cp";
    case GroupKind::Dp: return "dp";
    case GroupKind::Pp: return "pp";
    case GroupKind::DpCp: return "dp_cp";
    case GroupKind::TpCp: return "tp_cp";
    case GroupKind::TpDpCp: return "tp_dp_cp";
    case GroupKind::Ep: return "ep";
    case GroupKind::Etp: return "etp";
    case GroupKind::Edp: return "edp";
    case GroupKind::Embedding: return "embedding";
    case GroupKind::DpCpShard: return "dp_cp_shard";
    case GroupKind::DpCpReplicate: return "dp_cp_replicate";
  }
  return "?";
}

RankLayout::RankLayout(const recipe::MeshShape& shape) : shape_(shape) {
  if (shape.tp * shape.cp * shape.dp * shape.pp != shape.world_size ||
      shape.etp * shape.ep * shape.edp * shape.pp != shape.world_size)
    throw std::invalid_argument("mesh sizes do not multiply to the world size");
  if (shape.dp_shard < 0 || shape.dp % shape.shard_dp() != 0)
    throw std::invalid_argument("dp_shard does not divide dp");
}

Coordinates RankLayout::coordinates(int64_t rank) const {
  const auto& s = shape_;
  Coordinates c;
  int64_t r = rank;
  c.tp = r % s.tp;
  r /= s.tp;
  c.cp = r % s.cp;
  r /= s.cp;
  c.dp = r % s.dp;
  c.pp = r / s.dp;
  r = rank;
  c.etp = r % s.etp;
  r /= s.etp;
  c.ep = r % s.ep;
  r /= s.ep;
  c.edp = r % s.edp;
  return c;
}

int64_t RankLayout::dense_rank(int64_t tp, int64_t cp, int64_t dp, int64_t pp) const {
  const auto& s = shape_;
  return tp + s.tp * (cp + s.cp * (dp + s.dp * pp));
}

int64_t RankLayout::expert_rank(int64_t etp, int64_t ep, int64_t edp, int64_t pp) const {
  const auto& s = shape_;
  return etp + s.etp * (ep + s.ep * (edp + s.edp * pp));
}

std::vector<int64_t> RankLayout::group(GroupKind kind, int64_t rank) const {
  const auto& s = shape_;
  const Coordinates c = coordinates(rank);
  std::vector<int64_t> members;
  switch (kind) {
    case GroupKind::Tp:
      for (int64_t i = 0; i < s.tp; ++i) members.push_back(dense_rank(i, c.cp, c.dp, c.pp));
      break;
    case GroupKind::Cp:
      for (int64_t i = 0; i < s.cp; ++i) members.push_back(dense_rank(c.tp, i, c.dp, c.pp));
      break;
    case GroupKind::Dp:
      for (int64_t i = 0; i < s.dp; ++i) members.push_back(dense_rank(c.tp, c.cp, i, c.pp));
      break;
    case GroupKind::Pp:
      for (int64_t i = 0; i < s.pp; ++i) members.push_back(dense_rank(c.tp, c.cp, c.dp, i));
      break;
    case GroupKind::DpCp:  // cp fastest within the group, as in the rank order
      for (int64_t d = 0; d < s.dp; ++d)
        for (int64_t i = 0; i < s.cp; ++i) members.push_back(dense_rank(c.tp, i, d, c.pp));
      break;
    case GroupKind::TpCp:
      for (int64_t i = 0; i < s.cp; ++i)
        for (int64_t t = 0; t < s.tp; ++t) members.push_back(dense_rank(t, i, c.dp, c.pp));
      break;
    case GroupKind::TpDpCp:
      for (int64_t d = 0; d < s.dp; ++d)
        for (int64_t i = 0; i < s.cp; ++i)
          for (int64_t t = 0; t < s.tp; ++t) members.push_back(dense_rank(t, i, d, c.pp));
      break;
    case GroupKind::Ep:
      for (int64_t i = 0; i < s.ep; ++i) members.push_back(expert_rank(c.etp, i, c.edp, c.pp));
      break;
    case GroupKind::Etp:
      for (int64_t i = 0; i < s.etp; ++i) members.push_back(expert_rank(i, c.ep, c.edp, c.pp));
      break;
    case GroupKind::Edp:
      for (int64_t i = 0; i < s.edp; ++i) members.push_back(expert_rank(c.etp, c.ep, i, c.pp));
      break;
    case GroupKind::DpCpShard: {
      const int64_t first = c.dp / s.shard_dp() * s.shard_dp();
      for (int64_t d = first; d < first + s.shard_dp(); ++d)
        for (int64_t i = 0; i < s.cp; ++i) members.push_back(dense_rank(c.tp, i, d, c.pp));
      break;
    }
    case GroupKind::DpCpReplicate:
      for (int64_t d = c.dp % s.shard_dp(); d < s.dp; d += s.shard_dp()) members.push_back(dense_rank(c.tp, c.cp, d, c.pp));
      break;
    case GroupKind::Embedding: {
      const int64_t first = dense_rank(c.tp, c.cp, c.dp, 0), last = dense_rank(c.tp, c.cp, c.dp, s.pp - 1);
      members.push_back(first);
      if (last != first) members.push_back(last);
      if (std::find(members.begin(), members.end(), rank) == members.end()) return {rank};  // middle stage
      break;
    }
  }
  return members;
}

int64_t RankLayout::index_in(GroupKind kind, int64_t rank) const {
  const std::vector<int64_t> members = group(kind, rank);
  return std::find(members.begin(), members.end(), rank) - members.begin();
}

std::vector<std::vector<int64_t>> RankLayout::all_groups(GroupKind kind) const {
  std::vector<std::vector<int64_t>> groups;
  std::set<std::vector<int64_t>> seen;
  for (int64_t rank = 0; rank < shape_.world_size; ++rank) {
    auto g = group(kind, rank);
    if (kind == GroupKind::Embedding && g.size() == 1 && shape_.pp > 2) continue;  // middle stages have none
    if (seen.insert(g).second) groups.push_back(g);
  }
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return groups;
}

}  // namespace trainer::mesh
