#pragma once
// What `trainer run` does with --nproc-per-node, --nnodes and --node-rank in the environment it
// finds: be one worker of a job a launcher started (mpirun, srun, torchrun's variables), or start
// the workers itself (trainer's local launcher, one launch per host). The rules that refuse a
// contradictory command line live here, before anything starts.
#include "runtime/launch_env.h"
#include "runtime/local_launcher.h"

namespace trainer::runtime {

struct LaunchRequest {
  int nproc_per_node = 1;
  int nnodes = 1, node_rank = 0;
};

// Throws UserError when the flags contradict the environment or each other: --nnodes under a
// launcher, a node rank outside 0..nnodes-1, --nnodes without MASTER_ADDR and MASTER_PORT.
void check_launch_request(const LaunchRequest& request, const LaunchEnvironment& env, const GetEnv& getenv = nullptr);

// Whether this process starts the workers itself (no launcher, and more than one worker or host).
bool starts_local_workers(const LaunchRequest& request, const LaunchEnvironment& env);

// The local launcher's options for `request` (argv left empty): with several hosts, node 0's
// MASTER_ADDR and MASTER_PORT from the environment (UserError when the port is not one).
LocalLaunchOptions local_launch_options(const LaunchRequest& request, const GetEnv& getenv = nullptr);

// Throws UserError when --nproc-per-node > 1 was given although a launcher started this worker.
void check_no_local_launch_under_launcher(const LaunchRequest& request, const LaunchEnvironment& env);

}  // namespace trainer::runtime
