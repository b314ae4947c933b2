#include "runtime/device_assignment.h"

#include <fmt/format.h>

#include "core/error.h"

namespace trainer::runtime {

DeviceAssignment assign_device(const DeviceRequest& request) {
  using recipe::Backend;
  const Backend backend = request.backend;
  DeviceAssignment a;
  if (request.force_cpu || request.gpus <= 0) {
    if (backend == Backend::Nccl)
      throw UserError(fmt::format("parallel.backend=\"nccl\" needs a GPU for every rank, but {}; use "
                                  "parallel.backend=\"auto\" or \"gloo\"",
                                  request.force_cpu ? "--cpu was given" : "this machine has no usable CUDA device"));
    return a;  // the CPU, Gloo
  }
  a.on_gpu = true;
  if (backend == Backend::Gloo) {
    a.device_index = int(request.local_rank % request.gpus);
    // Local ranks r with r mod gpus == device share it.
    a.ranks_per_gpu = (request.local_world_size - a.device_index + request.gpus - 1) / request.gpus;
    return a;
  }
  if (request.local_world_size > request.gpus)
    throw UserError(fmt::format(
        "{} workers on this node but {} GPU{}: NCCL (parallel.backend=\"{}\") takes one GPU per rank. Start at most {} "
        "worker{} per node (--nproc-per-node), set parallel.backend=\"gloo\" to let ranks share the GPUs (through host "
        "memory: for testing, slow), or train on the CPU with --cpu",
        request.local_world_size, request.gpus, request.gpus == 1 ? "" : "s", backend, request.gpus,
        request.gpus == 1 ? "" : "s"));
  a.device_index = int(request.local_rank);
  a.nccl = true;
  return a;
}

}  // namespace trainer::runtime
