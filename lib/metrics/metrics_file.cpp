#include "metrics/metrics_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "core/error.h"

namespace trainer::metrics {

MetricsFile::MetricsFile(std::string path) : path_(std::move(path)) {
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec)
      throw UserError(fmt::format("{}: cannot create the metrics file's directory {} ({})", path_, parent.string(),
                                  ec.message()));
  }
  // Opening a FIFO for writing blocks until something reads it: refuse it instead of hanging.
  std::error_code status_error;
  if (std::filesystem::is_fifo(path_, status_error))
    throw UserError(fmt::format("{}: is a FIFO, not a metrics file; give the path of a regular file", path_));
  errno = 0;
  out_.open(path_, std::ios::out | std::ios::app);
  if (!out_)
    throw UserError(fmt::format("{}: cannot open metrics file for appending ({})", path_,
                                errno != 0 ? std::strerror(errno) : "unknown reason"));
}

void MetricsFile::write(const nlohmann::json& record) {
  if (!record.is_object())
    throw std::invalid_argument(fmt::format("{}: a metrics record must be a JSON object, not {}", path_,
                                            record.type_name()));
  // dump() throws on invalid UTF-8 in strings rather than writing a line no reader can parse.
  errno = 0;
  out_ << record.dump() << '\n';
  out_.flush();
  // A full disk or a device that refuses writes: the environment failed, not trainer.
  if (!out_)
    throw TrainingFailure(fmt::format("{}: writing the metrics file failed ({}); free space there or set "
                                      "logging.metrics_file to another path",
                                      path_, errno != 0 ? std::strerror(errno) : "unknown reason"));
}

void MetricsFile::write(const StepMetrics& metrics) { write(to_json(metrics)); }

}  // namespace trainer::metrics
