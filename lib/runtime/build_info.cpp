#include "runtime/build_info.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <nccl.h>
#include <torch/version.h>

#include "core/version.h"
#include "device_probe.h"

namespace trainer::runtime {

BuildInfo build_info() {
  BuildInfo info;
  info.version = version_string();
  info.git_commit = git_commit();
  info.torch_version = TORCH_VERSION;
  info.cuda_devices = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  const kernels::DeviceProbe probe = kernels::probe_device();
  if (probe.device_count > 0) {
    info.cuda_summary = fmt::format("{} x {} (sm_{}{}), {}", probe.device_count, probe.name, probe.compute_major,
                                    probe.compute_minor,
                                    probe.kernel_runs ? "trainer kernels run" : "trainer kernels fail: " + probe.error);
  } else {
    info.cuda_summary = fmt::format("not available ({})", probe.error.empty() ? "no device" : probe.error);
  }
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    info.nccl_version = fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100);
  }
  info.nccl_usable = !info.nccl_version.empty() && probe.device_count > 0 && probe.kernel_runs;
  return info;
}

std::string format_build_info(const BuildInfo& info) {
  return fmt::format(
      "trainer {} (commit {})\n"
      "libtorch {}\n"
      "CUDA: {}\n"
      "NCCL: {}\n",
      info.version, info.git_commit, info.torch_version, info.cuda_summary,
      info.nccl_version.empty() ? "not linked"
                                : fmt::format("{} linked, {}", info.nccl_version,
                                              info.nccl_usable ? "available" : "not available (no usable CUDA device)"));
}

}  // namespace trainer::runtime
