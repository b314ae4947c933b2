// The local launcher's description of a failed start: what a restart names as its cause.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include "runtime/local_launcher.h"

using namespace trainer;

namespace {
// A waitpid status for an exit code or a signal (W_EXITCODE is glibc's own encoding).
int exited(int code) { return W_EXITCODE(code, 0); }
int killed(int signal) { return W_EXITCODE(0, signal); }
}  // namespace

TEST_CASE("launcher: a failed worker's cause - killed by a signal - its message's first line - a named hang", "[runtime]") {
  CHECK(runtime::describe_worker_failure(2, killed(9), "") == "worker rank 2 was killed by signal 9");
  CHECK(runtime::describe_worker_failure(0, exited(1), "") == "worker rank 0 exited with code 1");
  CHECK(runtime::describe_worker_failure(1, exited(1), "exit 1\nrank 1: training failed: disk full\nmore\n") ==
        "worker rank 1 exited with code 1: rank 1: training failed: disk full");
  // The flight recorder's diagnosis: the collective and the rank that never entered it.
  const std::string hang =
      "exit 1\nrank 0: all_reduce on group dp timed out after 4 s\n"
      "flight recorder: all_reduce #57 on group dp (ranks [0, 1, 2]) at step 12 did not complete. Entered: ranks 0, 2.\n"
      "  rank 1 never entered it: it did not report (stopped, hung or dead); last seen completing all_reduce #56\n";
  CHECK(runtime::describe_worker_failure(0, exited(1), hang) ==
        "worker rank 0 exited with code 1: hang: all_reduce #57 on group dp (ranks [0, 1, 2]) at step 12: rank 1 never "
        "entered it: it did not report (stopped, hung or dead); last seen completing all_reduce #56");
}
