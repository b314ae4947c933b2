#pragma once
// Time of the operations a Timeline recorded (micro_batch.h) on a GPU profile:
//   GEMM        max(flops / (peak * gemm_efficiency) + gemm_latency, bytes / (HBM * hbm_efficiency))
//   attention   flops / (peak * attention_efficiency) + calls * gemm_latency  (flash attention,
//               causal half counted; ring attention makes one call per K/V block)
//   memory-bound  bytes / (HBM * hbm_efficiency) + kernels * kernel_overhead
//   collectives alpha-beta per link (comm_model.h); a ring-attention exchange is hidden behind the
//               attention computing beside it; a collective with GEMMs behind it (the column-parallel
//               backward: the input gradient's all-reduce or reduce-scatter behind the weight-gradient
//               GEMMs, the sequence-parallel re-gather behind the input-gradient GEMMs) shows only
//               max(0, comm - those GEMMs); a collective matmul (parallel.tp_comm_overlap) runs
//               tp - 1 send/recv steps of one chunk each, every step beside one chunk of the GEMMs
//               it feeds or is fed by: (tp - 1) x max(0, step - chunk GEMMs) exposed, the GEMMs
//               counted as tp chunk GEMMs (their latency and efficiency at a tp-th of the rows);
//               everything else inside a layer is exposed.

#include "estimate/comm_model.h"
#include "estimate/hardware.h"
#include "estimate/micro_batch.h"

namespace trainer::estimate {

struct SegmentTime {
  double gemm_s = 0, attention_s = 0, memory_bound_s = 0;
  double tp_comm_s = 0, cp_comm_s = 0, ep_comm_s = 0, pp_comm_s = 0;
  double tp_hidden_s = 0;  // tensor-parallel communication behind GEMMs (not in total())
  double kernels = 0;  // kernels and collectives the host launches (a count: not in total())
  double total() const {
    return gemm_s + attention_s + memory_bound_s + tp_comm_s + cp_comm_s + ep_comm_s + pp_comm_s;
  }
  void add(const SegmentTime& o, double times = 1);
};

// `fused_kernels`: memory-bound work as fused kernels would do it (Megatron/TE, torch.compile):
// a third of our eager implementation's traffic and launches.
SegmentTime segment_time(const Costs& costs, const HardwareProfile& gpu, recipe::Precision dtype,
                         const MeshPlacement& placement, bool fused_kernels);

}  // namespace trainer::estimate
