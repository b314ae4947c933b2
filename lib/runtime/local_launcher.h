#pragma once
// `trainer run --nproc-per-node N` without a launcher: starts N copies of this program as workers
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, the MASTER_PORT of the
// rendezvous store the launcher itself serves, TRAINER_STORE_IN_LAUNCHER=1). Across hosts
// (torchrun's --nnodes/--node-rank) one launch per host: the workers of node r are ranks
// r * N .. r * N + N - 1 of nnodes * N, and node 0's launcher serves the store on MASTER_PORT at
// MASTER_ADDR, which every node's workers reach.
// Forwards SIGINT/SIGTERM to them (a worker that then exits with 128 + that signal, as one waiting
// in the rendezvous does, is not a failure: the launcher exits with the same code), and when one
// fails stops the others (SIGHUP, a hard stop, then SIGKILL after a grace period) and reports which
// rank failed. Workers die with the launcher
// (PR_SET_PDEATHSIG), so no process is left behind.
#include <string>
#include <vector>

namespace trainer::runtime {

struct LocalLaunchOptions {
  int nproc = 1;                  // workers on this host
  int nnodes = 1, node_rank = 0;  // hosts of the job, and this one's place among them
  std::string master_addr;        // nnodes > 1: node 0's address (host name or IP)
  int master_port = 0;            // nnodes > 1: where node 0's launcher serves the store
  std::vector<std::string> argv;  // the worker's command line (argv[0] is replaced by this program)
  // Between SIGHUP and SIGKILL when stopping workers after a failure.
  double grace_seconds = 3;
  int max_restarts = 0;           // restarts after a failure (single host only)
};

// Runs the workers to completion. Returns 0 when all exited 0, else the first failure's exit code
// (128 + signal for a signal), after printing which rank failed.
//
// With max_restarts > 0, a failure (a worker killed, exiting non-zero, or timing out in a
// collective: the flight recorder's named hang is its message) stops every worker and starts them
// all again, at most max_restarts times, each restart printed with its cause. The workers learn
// it from TRAINER_RESTART (the count), TRAINER_RESTART_CAUSE, TRAINER_RESTART_SINCE (the job's
// first start, Unix seconds) and write their failure messages to TRAINER_FAILURE_DIR/rank-R.txt
// (launch_env.h); `trainer run` then resumes from the newest checkpoint the job committed. Never
// restarts after exit 2 (bad input) or 3 (diverged), which would only repeat, nor after a stop
// signal the launcher passed on. Exhausted restarts return 1 after naming the last cause.
int launch_local_workers(const LocalLaunchOptions& options);

// The cause of a failed start, from the first failing worker's exit status and the message it
// wrote (its record file's text, "" when none): "worker rank 2 was killed by signal 9", or
// "worker rank 1 exited with code 1: <the message's first line>", with the flight recorder's
// line naming the rank that never entered the collective when there is one ("hang: ...").
std::string describe_worker_failure(int rank, int status, const std::string& message);

// A TCP socket bound to 127.0.0.1 on a port the kernel chose, already listening (close-on-exec).
// The launcher serves the rendezvous store on it (workers connect as clients, rank 0 too): no other
// process can take the port between choosing it and serving it. Throws when no socket can be made.
struct ListeningSocket {
  int fd = -1;
  int port = 0;
};
ListeningSocket listen_on_free_port();
// The same on `port` of every address of this host (node 0 of a multi-host launch).
ListeningSocket listen_on_port(int port);

}  // namespace trainer::runtime
