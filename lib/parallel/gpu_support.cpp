#include "parallel/gpu_support.h"

#include <fmt/format.h>

#include "parallel/pipeline/schedule.h"

namespace trainer::parallel {

std::vector<std::string> gpu_support_problems(const recipe::Recipe& r, const recipe::MeshShape& mesh) {
  std::vector<std::string> problems;
  // NCCL matches point-to-point messages by posting order alone (the executor's tags serve Gloo).
  if (mesh.pp > 1) {
    const ScheduleSpec spec{parse_schedule_kind(r.parallel.pipeline_schedule), mesh.pp, mesh.vpp, mesh.grad_accum_steps};
    if (!in_order_per_stage_pair(spec))
      problems.push_back(fmt::format(
          "parallel.pipeline_schedule=\"{}\" at parallel.pp={} with {} micro-batches per step sends activations and "
          "gradients between the same two stages in different orders on the two sides, which NCCL cannot match; on "
          "GPUs use 1f1b, zero_bubble or gpipe (or interleaved_1f1b with micro-batches per step a multiple of pp)",
          r.parallel.pipeline_schedule, mesh.pp, mesh.grad_accum_steps));
  }
  // Ring attention's blocks call ATen's CUDA flash kernel on GPUs (parallel/context/attention_block.cpp),
  // but no GPU has run that path yet (unit_parallel's "[cuda]" case checks it on one): refused
  // until it has, rather than trusted. Ulysses runs SDPA, on any device.
  if (mesh.cp > 1 && r.parallel.cp_method == "ring")
    problems.push_back(fmt::format("parallel.cp={} with cp_method \"ring\" runs on the CPU only in this build (its GPU "
                                   "path has not been checked on a GPU yet); on GPUs use parallel.cp_method=\"ulysses\"",
                                   mesh.cp));
  return problems;
}

}  // namespace trainer::parallel
