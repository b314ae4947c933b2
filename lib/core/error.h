#pragma once
// The error policy (DESIGN.md section 8): problems with what the user gave us (recipe, command
// line, input files) are UserErrors and end the program with exit code 2 before anything starts;
// every other exception is an internal failure and ends it with exit code 1. Both are caught
// once, in app/.
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

// kExitDiverged: the loss or the gradients went non-finite; a restart from the last checkpoint
// would only repeat it, so launchers that restart (checkpoint.max_restarts) stop on it, as on 2.
enum ExitCode : int { kExitOk = 0, kExitRuntimeFailure = 1, kExitUsageError = 2, kExitDiverged = 3 };

// Bad user input. The message names the file or JSON path, what was found and what is expected.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Training itself failed (the loss or the gradients diverged) or its environment did (out of
// memory, a full disk, the checkpoint directory taken over by another job): neither bad input nor
// a bug of trainer. Reported as "training failed: ..." with exit code 1; the message says what to try.
class TrainingFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The loss or a gradient went non-finite: "training failed: ..." with exit code 3 (kExitDiverged).
class Diverged : public TrainingFailure {
 public:
  using TrainingFailure::TrainingFailure;
};

// Several problems found in one pass over a recipe, reported together.
class RecipeError : public UserError {
 public:
  RecipeError(std::string source, std::vector<std::string> problems);
  const std::string& source() const { return source_; }
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::string source_;
  std::vector<std::string> problems_;
};

// "error: " (or any prefix) before every line of `text`, so that each problem of a multi-line
// message reads the same: "error: r.json: model.x ...\nerror: r.json: parallel.y ...".
std::string prefix_lines(const std::string& text, const std::string& prefix);

}  // namespace trainer
