#pragma once
// Exceptions mapped to exit codes, in one place (DESIGN.md section 8): user errors (recipe, CLI,
// files) exit 2, a stop signal 128 + the signal, everything else 1. Called from a catch block by
// main (the whole program) and by `run` around one rank of a multi-rank job, whose messages name
// the rank.
#include <cstdint>
#include <optional>
#include <string>

namespace trainer::app {

struct FailureScope {
  std::optional<int64_t> rank;  // set: this rank of a multi-rank job ("rank N: " before the message)
  bool print_interrupt = true;  // whether a stop signal's message is printed here (once per node)
  // Set: the message (after a first line "exit CODE") is also written to this file, for the
  // launcher that restarts the job to name the cause (runtime/local_launcher.h).
  std::string record_file;
};

// Prints the exception being handled (std::current_exception) to stderr and returns its exit code.
// Must be called inside a catch block.
int report_failure(const FailureScope& scope = {});

}  // namespace trainer::app
