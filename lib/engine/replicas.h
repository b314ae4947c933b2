#pragma once
// Which ranks hold identical copies of a parameter (DESIGN.md invariant 8): the ranks of its
// pipeline stage that sit at the same position in every group the parameter is sharded over (a
// tp-sharded weight: its dp x cp group; a norm weight: the whole stage; an expert sharded over ep:
// its edp group). The gradient norm counts each unique element on one of them only, and a
// checkpoint writes each unique slice once.
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "mesh/rank_layout.h"
#include "model/parameter.h"

namespace trainer::engine {

struct ReplicaSet {
  std::vector<int64_t> ranks;  // ascending global ranks, `rank` included
  int64_t position = 0;        // of `rank` in `ranks`
  std::string name;            // the group kind with exactly these ranks ("dp_cp", "tp_dp_cp", ...), or "ranks a,b,..."
  bool first() const { return position == 0; }
};

// The ranks that hold the same slice of `p` as `rank`.
ReplicaSet parameter_replicas(const mesh::RankLayout& layout, int64_t rank, const model::Parameter& p);

// After the gradient of `p` is reduce-scattered over `group` (ZeRO), each rank of the group holds
// another part; the ranks that hold the same part as `rank`.
ReplicaSet shard_replicas(const mesh::RankLayout& layout, int64_t rank, const model::Parameter& p,
                          mesh::GroupKind group);

// Every rank of the job (a tensor all ranks hold, like the optimizer's step counts with pp = 1).
ReplicaSet world_replicas(const mesh::RankLayout& layout, int64_t rank);
// The ranks of `rank`'s pipeline stage (what every rank of a stage holds whole).
ReplicaSet stage_replicas(const mesh::RankLayout& layout, int64_t rank);

// The ranks of `rank`'s stage that hold some slice of `p`: the whole stage for a dense weight, the
// stage's ranks at `rank`'s position in the ep group for an expert under expert parallelism (what
// holds a per-parameter scalar such as its optimizer step count).
ReplicaSet holder_replicas(const mesh::RankLayout& layout, int64_t rank, const model::Parameter& p);

// How a checkpoint record of data held by these ranks says so.
checkpoint::TensorRecord::Replication as_replication(const ReplicaSet& set);

}  // namespace trainer::engine
