#pragma once
// Collectives in the alpha-beta model, per link. Which groups leave a node follows from the rank
// order (Megatron's tp-cp-ep-dp-pp, tp fastest; experts etp-ep-edp-pp over the same ranks) and
// hardware.gpus_per_node: a group of `size` ranks spaced `stride` apart stays inside one NVLink
// domain when stride * size <= gpus_per_node, and otherwise runs at the network's rate.
//
// Ring algorithms (Thakur et al. 2005; NCCL), for a buffer of S bytes over n ranks with per-step
// latency a and bus bandwidth B:
//   all-reduce 2 (n-1) a + 2 (n-1)/n S/B;  all-gather, reduce-scatter, all-to-all (n-1) a + (n-1)/n S/B;
//   send/receive a + S/B.
#include <cstdint>

#include "estimate/hardware.h"
#include "estimate/micro_batch.h"
#include "recipe/mesh_shape.h"

namespace trainer::estimate {

struct GroupPlacement {
  int64_t size = 1;
  int64_t stride = 1;
  bool crosses_nodes = false;
};

struct MeshPlacement {
  GroupPlacement tp, cp, dp, pp, ep, etp, edp;
  GroupPlacement dp_cp;  // dense gradients are reduced over dp x cp (stride tp)
  // Hybrid sharding: ZeRO's group of dp_shard x cp ranks (stride tp) and the replicas of a shard
  // (stride tp x cp x dp_shard); without hybrid sharding dp_cp and one rank.
  GroupPlacement dp_cp_shard, dp_cp_replicate;
  const GroupPlacement& of(CommGroup group) const;
};

MeshPlacement place_groups(const recipe::MeshShape& mesh, int64_t gpus_per_node);

// Seconds for one collective over `group` moving a buffer of `bytes`.
double collective_seconds(CommKind kind, double bytes, const GroupPlacement& group, const HardwareProfile& gpu);

}  // namespace trainer::estimate
