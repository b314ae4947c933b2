#pragma once
// Which device a worker computes on and how it talks to the others, from parallel.backend, the
// --cpu flag, the worker's place on its node and the GPUs there. Decided before anything starts
// (no process group, no allocation), so a layout that cannot work is refused as a recipe error.
#include <cstdint>

#include "recipe/choices.h"

namespace trainer::runtime {

struct DeviceRequest {
  recipe::Backend backend = recipe::Backend::Auto;  // parallel.backend
  bool force_cpu = false;                           // --cpu
  int64_t local_rank = 0, local_world_size = 1;
  int gpus = 0;                  // CUDA devices visible to this worker
};

struct DeviceAssignment {
  bool on_gpu = false;
  int device_index = -1;      // the GPU this worker computes on; -1 on the CPU
  bool nccl = false;          // NCCL between GPUs; otherwise Gloo (CUDA tensors staged through host memory)
  int64_t ranks_per_gpu = 1;  // local workers sharing this worker's GPU (they share its memory)
};

// Throws UserError naming parallel.backend (or --nproc-per-node) when the request cannot be met:
// nccl without a GPU or with --cpu, or more local workers than GPUs without gloo (NCCL takes one
// GPU per rank).
DeviceAssignment assign_device(const DeviceRequest& request);

}  // namespace trainer::runtime
