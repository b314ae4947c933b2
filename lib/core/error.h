#pragma once
// The error policy (DESIGN.md section 8): problems with what the user gave us (recipe, command
// line, input files) are UserErrors and end the program with exit code 2 before anything starts;
// every other exception is an internal failure and ends it with exit code 1. Both are caught
// once, in app/.
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

enum ExitCode : int { kExitOk = 0, kExitRuntimeFailure = 1, kExitUsageError = 2 };

// Bad user input. The message names the file or JSON path, what was found and what is expected.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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

}  // namespace trainer
