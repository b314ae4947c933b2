#include "runtime/cpu_threads.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace trainer::runtime {

CpuThreads choose_cpu_threads(int64_t local_world_size, const GetEnv& getenv_in, int online_cores, int bound_cores) {
  const GetEnv getenv = getenv_in ? getenv_in : [](const char* name) { return std::getenv(name); };
  if (const char* omp = getenv("OMP_NUM_THREADS"); omp && *omp) {
    char* end = nullptr;
    const long value = std::strtol(omp, &end, 10);
    if (*end != '\0' || value < 1 || value > 4096)
      throw UserError(fmt::format("OMP_NUM_THREADS={}: expected a positive number of threads", omp));
    return {int(value), fmt::format("OMP_NUM_THREADS={}", value)};
  }
  if (online_cores <= 0) online_cores = int(std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN)));
  if (bound_cores <= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    bound_cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : online_cores;
  }
  if (bound_cores < online_cores)
    return {bound_cores, fmt::format("the {} core{} this process is bound to", bound_cores, bound_cores == 1 ? "" : "s")};
  const int64_t workers = std::max<int64_t>(1, local_world_size);
  const int threads = int(std::max<int64_t>(1, online_cores / workers));
  return {threads, fmt::format("{} core{} / {} local worker{}", online_cores, online_cores == 1 ? "" : "s", workers,
                               workers == 1 ? "" : "s")};
}

}  // namespace trainer::runtime
