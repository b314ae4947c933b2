#pragma once
// Running a shell script from the multi-process tests.
#include <string>

#include "process.h"

namespace trainer::test {

// Runs a shell script from a file, so that no process's command line but the programs it starts
// contains the script's text (pgrep -f finds workers and leftover processes by their arguments).
// One intra-op thread per process: several ranks share the machine's cores.
inline ProcessResult bash(const std::string& script, double timeout = 300) {
  TempDir dir;
  const std::string file = dir.write("script.sh", script);
  return run_process({"/bin/bash", file}, timeout, {"OMP_NUM_THREADS=1"});
}

}  // namespace trainer::test
