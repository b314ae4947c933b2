#include "parallel/gpu_support.h"

#include <fmt/format.h>

#include "parallel/pipeline/schedule.h"

namespace trainer::parallel {

std::vector<std::string> gpu_support_problems(const recipe::Recipe& r, const recipe::MeshShape& mesh) {
  std::vector<std::string> problems;
  // NCCL matches point-to-point messages by posting order alone (the executor's tags serve Gloo,
  // which parallel.backend "gloo" uses on GPUs too).
  if (mesh.pp > 1 && r.parallel.backend != recipe::Backend::Gloo) {
    const ScheduleSpec spec{r.parallel.pipeline_schedule, mesh.pp, mesh.vpp, mesh.grad_accum_steps};
    if (!in_order_per_stage_pair(spec))
      problems.push_back(fmt::format(
          "parallel.pipeline_schedule=\"{}\" at parallel.pp={} with {} micro-batches per step sends activations and "
          "gradients between the same two stages in different orders on the two sides, which NCCL cannot match; on "
          "GPUs use 1f1b, zero_bubble or gpipe (or interleaved_1f1b with micro-batches per step a multiple of pp)",
          r.parallel.pipeline_schedule, mesh.pp, mesh.grad_accum_steps));
  }
  // Ring attention's blocks call ATen's CUDA flash kernel on GPUs (parallel/context/attention_block.cpp),
  // which takes 16-bit inputs with a head size that is a multiple of 8, at most 256.
  if (mesh.cp > 1 && r.parallel.cp_method == recipe::CpMethod::Ring) {
    if (r.training.dtype != recipe::Precision::BF16)
      problems.push_back(fmt::format("parallel.cp={} with cp_method \"ring\" on GPUs runs the flash attention "
                                     "kernel, which takes bf16, but training.dtype is \"{}\"; use training.dtype="
                                     "\"bf16\" or parallel.cp_method=\"ulysses\"",
                                     mesh.cp, r.training.dtype));
    const int64_t head_dim = r.model.attention_head_dim();
    if (head_dim % 8 != 0 || head_dim > 256)
      problems.push_back(fmt::format("parallel.cp={} with cp_method \"ring\" on GPUs runs the flash attention "
                                     "kernel, which takes a head size that is a multiple of 8 up to 256, but "
                                     "the attention head size is {}{}; use parallel.cp_method=\"ulysses\"",
                                     mesh.cp, head_dim, r.model.mla ? " (model.mla's qk_nope + qk_rope)" : " (model.head_dim)"));
  }
  return problems;
}

}  // namespace trainer::parallel
