#pragma once
// Running the trainer binary (or any program) from tests: captured output, exit code, and a
// hard timeout after which the whole process group is killed, so no test can hang.
#include <string>
#include <vector>

namespace trainer::test {

struct ProcessResult {
  int exit_code = -1;     // exit status, or -1 when killed by a signal
  int signal = 0;         // the terminating signal, 0 when it exited
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
};

// Runs argv[0] with arguments; `stdin_text` is written to its standard input.
ProcessResult run_process(const std::vector<std::string>& argv, double timeout_seconds = 60,
                          const std::vector<std::string>& extra_env = {});

// The trainer binary and the source tree, as configured by CMake.
std::string trainer_binary();
std::string source_dir();

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& content) const;  // returns the file path

 private:
  std::string path_;
};

std::string read_file(const std::string& path);

}  // namespace trainer::test
