#include "estimate/comm_model.h"

namespace trainer::estimate {

const GroupPlacement& MeshPlacement::of(CommGroup group) const {
  switch (group) {
    case CommGroup::Tp: return tp;
    case CommGroup::Cp: return cp;
    case CommGroup::Ep: return ep;
    case CommGroup::Etp: return etp;
    case CommGroup::Dp: return dp_cp;
    case CommGroup::Edp: return edp;
    case CommGroup::Pp: return pp;
  }
  return tp;
}

MeshPlacement place_groups(const recipe::MeshShape& m, int64_t gpus_per_node) {
  auto place = [&](int64_t size, int64_t stride) {
    GroupPlacement g;
    g.size = size;
    g.stride = stride;
    g.crosses_nodes = size > 1 && stride * size > gpus_per_node;
    return g;
  };
  MeshPlacement p;
  p.tp = place(m.tp, 1);
  p.cp = place(m.cp, m.tp);
  p.dp = place(m.dp, m.tp * m.cp);
  p.dp_cp = place(m.dp * m.cp, m.tp);
  p.dp_cp_shard = place(m.shard_dp() * m.cp, m.tp);
  p.dp_cp_replicate = place(m.dp / m.shard_dp(), m.tp * m.cp * m.shard_dp());
  p.pp = place(m.pp, m.tp * m.cp * m.dp);
  p.etp = place(m.etp, 1);
  p.ep = place(m.ep, m.etp);
  p.edp = place(m.edp, m.etp * m.ep);
  return p;
}

double collective_seconds(CommKind kind, double bytes, const GroupPlacement& group, const HardwareProfile& gpu) {
  if (bytes <= 0) return 0;
  if (group.size <= 1 && kind != CommKind::SendRecv) return 0;
  const LinkProfile& link = group.crosses_nodes ? gpu.network : gpu.nvlink;
  const double bw = link.bytes_per_s * link.efficiency;
  const double n = double(group.size);
  switch (kind) {
    case CommKind::AllReduce: return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * bytes / bw;
    case CommKind::AllGather:
    case CommKind::ReduceScatter:
    case CommKind::AllToAll: return (n - 1) * link.latency_s + (n - 1) / n * bytes / bw;
    case CommKind::SendRecv: return link.latency_s + bytes / bw;
  }
  return 0;
}

}  // namespace trainer::estimate
