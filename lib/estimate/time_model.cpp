#include "estimate/time_model.h"

#include <algorithm>

namespace trainer::estimate {

namespace {
constexpr double kFusedFraction = 1.0 / 3.0;

double gemm_seconds(const GemmShape& g, const HardwareProfile& gpu, double peak, double hbm) {
  const double efficiency = g.grouped ? gpu.grouped_gemm_efficiency : gpu.gemm_efficiency;
  const double compute = g.flops() / (peak * efficiency) + gpu.gemm_latency_s;
  return std::max(compute, g.bytes / hbm);
}
}  // namespace

void SegmentTime::add(const SegmentTime& o, double times) {
  gemm_s += o.gemm_s * times;
  attention_s += o.attention_s * times;
  memory_bound_s += o.memory_bound_s * times;
  tp_comm_s += o.tp_comm_s * times;
  tp_hidden_s += o.tp_hidden_s * times;
  cp_comm_s += o.cp_comm_s * times;
  ep_comm_s += o.ep_comm_s * times;
  pp_comm_s += o.pp_comm_s * times;
  kernels += o.kernels * times;
}

SegmentTime segment_time(const Costs& costs, const HardwareProfile& gpu, recipe::Precision dtype,
                         const MeshPlacement& placement, bool fused_kernels) {
  SegmentTime t;
  t.kernels = double(costs.gemms.size()) + double(costs.memory_kernels) + double(costs.attention_calls) +
               double(costs.comms.size());
  const double peak = gpu.peak_flops(dtype);
  const double hbm = gpu.hbm_bytes_per_s * gpu.hbm_efficiency;
  for (const auto& g : costs.gemms) t.gemm_s += gemm_seconds(g, gpu, peak, hbm);
  t.attention_s = costs.attention_flops / (peak * gpu.attention_efficiency) +
                  double(costs.attention_calls) * gpu.gemm_latency_s;
  const double fraction = fused_kernels ? kFusedFraction : 1.0;
  t.memory_bound_s = fraction * (costs.memory_bytes / hbm + double(costs.memory_kernels) * gpu.kernel_overhead_s);
  double overlapped_cp = 0;
  for (const auto& c : costs.comms) {
    double behind = 0;
    for (const auto& g : c.behind) behind += gemm_seconds(g, gpu, peak, hbm);
    double full = 0, s = 0;
    if (c.ring_steps > 0) {
      // A collective matmul: every step's transfer beside one chunk's GEMMs.
      const double step = collective_seconds(CommKind::SendRecv, c.bytes / double(c.ring_steps + 1),
                                             placement.of(c.group), gpu);
      full = double(c.ring_steps) * step;
      s = double(c.ring_steps) * std::max(0.0, step - behind);
    } else {
      // Behind GEMMs issued while it flies (already counted in gemm_s), only the rest is exposed.
      full = collective_seconds(c.kind, c.bytes, placement.of(c.group), gpu);
      s = std::max(0.0, full - behind);
    }
    switch (c.group) {
      case CommGroup::Tp:
      case CommGroup::Etp:
        t.tp_comm_s += s;
        t.tp_hidden_s += full - s;
        break;
      case CommGroup::Cp:
        if (c.overlapped)
          overlapped_cp += s;
        else
          t.cp_comm_s += s;
        break;
      case CommGroup::Ep: t.ep_comm_s += s; break;
      case CommGroup::Pp: t.pp_comm_s += s; break;
      case CommGroup::Dp:
      case CommGroup::Edp: break;  // gradient reduction is modelled per step
    }
  }
  t.cp_comm_s += std::max(0.0, overlapped_cp - t.attention_s);
  return t;
}

}  // namespace trainer::estimate
