#pragma once
// What this binary was built with and what it finds at run time: version, git commit, libtorch,
// CUDA devices (and whether our kernels run on them), NCCL. Printed by `trainer --version`.
#include <string>

namespace trainer::runtime {

struct BuildInfo {
  std::string version, git_commit, torch_version;
  int cuda_devices = 0;           // as libtorch sees them
  std::string cuda_summary;       // "1 x NVIDIA H100 80GB HBM3 (sm_90), kernels run" or why not
  std::string nccl_version;       // of the linked library, "2.27.7"
  bool nccl_usable = false;       // linked and at least one CUDA device
};

BuildInfo build_info();

std::string format_build_info(const BuildInfo& info);

}  // namespace trainer::runtime
