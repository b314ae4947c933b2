#pragma once
// How many intra-op threads a worker uses on its CPU. Without a choice, every libtorch process
// takes all cores, so N workers on one node run N x cores threads and thrash (tiny-llama with two
// workers on 2 cores: 36 s instead of 4 s). The default splits the node's cores among its workers.
#include <string>

#include "runtime/launch_env.h"

namespace trainer::runtime {

struct CpuThreads {
  int threads = 1;
  std::string reason;  // for the one line the job prints: "OMP_NUM_THREADS=4", "16 cores / 8 local workers"
};

// OMP_NUM_THREADS (a positive integer) wins; a process bound to fewer cores than the node has (mpirun
// and srun bindings) uses the cores it is bound to; otherwise the node's cores / local workers,
// at least 1. `online_cores` and `bound_cores` are the machine's (0: read them).
CpuThreads choose_cpu_threads(int64_t local_world_size, const GetEnv& getenv = nullptr, int online_cores = 0,
                              int bound_cores = 0);

}  // namespace trainer::runtime
