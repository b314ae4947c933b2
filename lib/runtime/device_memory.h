#pragma once
// How much memory one rank of this host may use, for the check before training (app/cmd_run.cpp):
// on a GPU the device's free memory; on the CPU MemAvailable shared by the local ranks, bounded by
// the cgroup's memory limit and by an address-space limit (ulimit -v) when set.
#include <cstdint>
#include <string>

namespace trainer::runtime {

struct AvailableMemory {
  double bytes = 0;        // what one rank may use; 0 when unknown (nothing could be read)
  std::string source;      // where the number came from, e.g. "MemAvailable 21.4 GiB / 2 local ranks"
  std::string device;      // "the CPU", "cuda:0 (NVIDIA H100 80GB HBM3)"
  std::string gpu_name;    // the GPU's name as the driver reports it ("" on the CPU)
};

// The CPU: `local_ranks` ranks share the host's memory.
AvailableMemory available_cpu_memory(int64_t local_ranks);
// The GPU `device_index` (free memory as the driver reports it, split evenly between
// `sharing_ranks` ranks on it; creates the CUDA context).
AvailableMemory available_gpu_memory(int device_index, int64_t sharing_ranks = 1);

// The room left under the memory limit of the cgroup file system at `root` (v2's memory.max, or
// v1's memory/memory.limit_in_bytes), counting the page cache (active and inactive file pages) as
// room, since the kernel reclaims it first; -1 when no limit is set or none can be read.
double cgroup_memory_room(const std::string& root);

// "21.4 GiB"
std::string gib(double bytes);

}  // namespace trainer::runtime
