#pragma once
// Who this process is in the job, read from the launcher's environment. The only place in lib/
// that reads environment variables besides the rest of lib/runtime (DESIGN.md section 4).
// Precedence: RANK/WORLD_SIZE (torchrun, and trainer's own local launcher), then OpenMPI
// (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK, PMI_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS).
#include <functional>
#include <string>
#include <vector>

namespace trainer::runtime {

struct LaunchEnvironment {
  std::string launcher = "none";  // "env", "openmpi", "pmi", "slurm" or "none"
  int64_t rank = 0, world_size = 1;
  int64_t local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string master_source = "default";  // where the address came from, for messages
  bool store_in_launcher = false;  // trainer's local launcher serves the store: rank 0 is a client too
  std::vector<std::string> nodes;         // Slurm's node list, expanded
  std::string job;  // "slurm job 1234", "mpirun job NS", "local job (launcher pid N)", "" standalone
  // Set by a launcher that restarts the job (trainer's own, scripts/slurm/train.sbatch,
  // scripts/restart_job around srun or mpirun; docs/distributed.md#restarts):
  int64_t restart = 0;         // TRAINER_RESTART: this start is the job's N-th restart (0: the first start)
  std::string restart_cause;   // TRAINER_RESTART_CAUSE: why the previous start ended
  int64_t restart_since = 0;   // TRAINER_RESTART_SINCE: Unix time of the job's first start (0: unknown);
                               // checkpoints committed before it are not this job's
  std::string failure_dir;     // TRAINER_FAILURE_DIR: a failing worker writes its message to rank-R.txt there
};

using GetEnv = std::function<const char*(const char*)>;

// Reads the environment (by default the process's). Inconsistent values (rank >= world size,
// a multi-node MPI job without MASTER_ADDR) throw UserError naming the variables.
LaunchEnvironment detect_launch_environment(const GetEnv& getenv = nullptr);

// Expands a Slurm hostlist: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
// Several bracket groups per name work ("r[1-2]n[1-2]"); zero padding is kept. UserError when malformed.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

}  // namespace trainer::runtime
