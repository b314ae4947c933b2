#pragma once
// The 5-D rank math (DESIGN.md section 6): pure and torch-free. Ranks are laid out in Megatron's
// order tp-cp-ep-dp-pp, tp fastest. Dense layers see the ranks as tp x cp x dp x pp; expert layers
// fold the same ranks into etp x ep x edp x pp ("MoE parallel folding"); pipeline groups coincide.
//   dense:  rank = tp + TP * (cp + CP * (dp + DP * pp))
//   expert: rank = etp + ETP * (ep + EP * (edp + EDP * pp))
#include <cstdint>
#include <string>
#include <vector>

#include "recipe/mesh_shape.h"

namespace trainer::mesh {

struct Coordinates {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;  // dense view
  int64_t etp = 0, ep = 0, edp = 0;        // expert view (same pp)
};

// The groups a rank belongs to. DpCp is the data x context group (ZeRO shards over it), TpCp the
// tensor x context group, TpDpCp the whole pipeline stage (sequence-parallel norm gradients);
// Embedding holds the first and last pipeline stage of a pipeline group (tied embeddings), a
// single rank when pp = 1.
// DpCpShard and DpCpReplicate split DpCp for hybrid sharding (recipe parallel.dp_shard): the ranks of
// dp_shard consecutive dp positions (x cp), and the ranks at the same position in every such group.
// Without hybrid sharding DpCpShard is DpCp and DpCpReplicate has one rank.
enum class GroupKind { Tp, Cp, Dp, Pp, DpCp, TpCp, TpDpCp, Ep, Etp, Edp, Embedding, DpCpShard, DpCpReplicate };

const std::vector<GroupKind>& all_group_kinds();  // the creation order
std::string group_kind_name(GroupKind kind);      // "tp", "dp_cp", ...

class RankLayout {
 public:
  explicit RankLayout(const recipe::MeshShape& shape);

  const recipe::MeshShape& shape() const { return shape_; }
  int64_t world_size() const { return shape_.world_size; }
  Coordinates coordinates(int64_t rank) const;
  int64_t dense_rank(int64_t tp, int64_t cp, int64_t dp, int64_t pp) const;
  int64_t expert_rank(int64_t etp, int64_t ep, int64_t edp, int64_t pp) const;

  // The global ranks of `rank`'s group of this kind, in group-rank order.
  std::vector<int64_t> group(GroupKind kind, int64_t rank) const;
  // The position of `rank` in its group of this kind.
  int64_t index_in(GroupKind kind, int64_t rank) const;
  // Every group of this kind, ordered by their first rank; each rank is in exactly one.
  std::vector<std::vector<int64_t>> all_groups(GroupKind kind) const;

 private:
  recipe::MeshShape shape_;
};

}  // namespace trainer::mesh
