#pragma once
// The metrics file (logging.metrics_file): JSON Lines, one object per logged step, appended so a
// resumed run continues the same file, and flushed after every line so a crash loses nothing
// already logged and a reader can follow it live.
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "metrics/step_metrics.h"

namespace trainer::metrics {

class MetricsFile {
 public:
  // Opens `path` for appending, creating missing parent directories. Throws trainer::UserError
  // naming the file (and the system's reason) when it cannot be opened.
  explicit MetricsFile(std::string path);

  // Appends `record` (a JSON object) as one line and flushes. Throws std::invalid_argument for a
  // record that is not an object and std::runtime_error naming the file when writing fails.
  void write(const nlohmann::json& record);

  // write(to_json(metrics)).
  void write(const StepMetrics& metrics);

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace trainer::metrics
