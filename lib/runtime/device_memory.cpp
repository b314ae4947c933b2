#include "runtime/device_memory.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

namespace trainer::runtime {

namespace {

// A "Key:   123 kB" line of /proc/meminfo or /proc/self/status, in bytes; -1 when absent.
double proc_field(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double value = 0;
    std::string unit;
    if (!(fields >> value)) return -1;
    fields >> unit;
    return unit == "kB" ? value * 1024 : value;
  }
  return -1;
}

// A number in a cgroup file ("max" and unreadable: -1).
double cgroup_value(const std::string& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stod(text);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

double cgroup_memory_room(const std::string& root) {
  // cgroup v2, then v1. The usage counts the page cache (after a build or a data read, the cache can
  // fill the whole limit), which the kernel drops before it refuses an allocation: it is room.
  double limit = cgroup_value(root + "/memory.max"), used = cgroup_value(root + "/memory.current");
  std::string stat = root + "/memory.stat", inactive = "inactive_file", active = "active_file";
  if (limit < 0) {
    limit = cgroup_value(root + "/memory/memory.limit_in_bytes");
    used = cgroup_value(root + "/memory/memory.usage_in_bytes");
    stat = root + "/memory/memory.stat";
    inactive = "total_inactive_file";
    active = "total_active_file";
  }
  if (limit <= 0 || limit >= 1e18 || used < 0) return -1;  // v1 writes "no limit" as 2^63 - 4096
  double cache = 0;
  std::ifstream in(stat);
  for (std::string key; in >> key;) {
    double value = 0;
    if (!(in >> value)) break;
    if (key == inactive || key == active) cache += value;
  }
  return std::max(0.0, limit - std::max(0.0, used - cache));
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / double(1ull << 30)); }

AvailableMemory available_cpu_memory(int64_t local_ranks) {
  AvailableMemory out;
  out.device = "the CPU";
  const int64_t ranks = std::max<int64_t>(1, local_ranks);
  auto share = [&](double host_bytes, const std::string& what) {
    const double per_rank = host_bytes / double(ranks);
    if (out.bytes > 0 && per_rank >= out.bytes) return;
    out.bytes = per_rank;
    out.source = ranks > 1 ? fmt::format("{} {} / {} local ranks", what, gib(host_bytes), ranks)
                           : fmt::format("{} {}", what, gib(host_bytes));
  };
  if (const double available = proc_field("/proc/meminfo", "MemAvailable"); available > 0)
    share(available, "MemAvailable");
  // A container's limit, which MemAvailable (the host's) does not show.
  if (const double room = cgroup_memory_room("/sys/fs/cgroup"); room >= 0)
    share(room, "the cgroup's memory limit less its use (page cache not counted)");
  // ulimit -v bounds this process alone, mapped libraries included.
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const double mapped = std::max(0.0, proc_field("/proc/self/status", "VmSize"));
    const double left = std::max(0.0, double(as.rlim_cur) - mapped);
    if (out.bytes <= 0 || left < out.bytes) {
      out.bytes = std::max(left, 1.0);  // nothing left is a refusal, not "unknown" (0)
      out.source = fmt::format("the address-space limit (ulimit -v) {} less the {} already mapped", gib(double(as.rlim_cur)),
                               gib(mapped));
    }
  }
  return out;
}

AvailableMemory available_gpu_memory(int device_index, int64_t sharing_ranks) {
  c10::cuda::CUDAGuard guard(c10::DeviceIndex{static_cast<c10::DeviceIndex>(device_index)});
  size_t free = 0, total = 0;
  AvailableMemory out;
  out.gpu_name = at::cuda::getDeviceProperties(device_index)->name;
  out.device = fmt::format("cuda:{} ({})", device_index, out.gpu_name);
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return out;
  }
  const int64_t ranks = std::max<int64_t>(1, sharing_ranks);
  out.bytes = double(free) / double(ranks);
  out.source = fmt::format("free memory of {}: {} of {}{}", out.device, gib(double(free)), gib(double(total)),
                           ranks > 1 ? fmt::format(" / {} ranks sharing it", ranks) : "");
  return out;
}

}  // namespace trainer::runtime
