#include "failure_report.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "core/error.h"
#include "runtime/stop_signal.h"

namespace trainer::app {

namespace {

struct Report {
  std::string text;  // what stderr gets ("" for nothing)
  int code = kExitRuntimeFailure;
};

Report describe_current_exception(const FailureScope& scope) {
  const std::string rank = scope.rank ? fmt::format("rank {}: ", *scope.rank) : "";
  try {
    throw;
  } catch (const UserError& e) {
    return {prefix_lines(e.what(), rank + "error: "), kExitUsageError};
  } catch (const Diverged& e) {
    return {fmt::format("{}training failed: {}", rank, e.what()), kExitDiverged};
  } catch (const TrainingFailure& e) {
    return {fmt::format("{}training failed: {}", rank, e.what()), kExitRuntimeFailure};
  } catch (const runtime::Interrupted& e) {
    // 130 for SIGINT, 143 for SIGTERM, as a shell reports a process they killed
    return {scope.print_interrupt ? std::string(e.what()) : std::string(), e.exit_code()};
  } catch (const std::exception& e) {
    const std::string text = e.what();
    if (!scope.rank) return {"internal error: " + text, kExitRuntimeFailure};
    // a rank's failure may name its rank already (a collective's error does)
    return {(text.rfind("rank ", 0) == 0 ? "" : rank) + text, kExitRuntimeFailure};
  } catch (...) {
    return {rank + "internal error: unknown exception", kExitRuntimeFailure};
  }
}

}  // namespace

int report_failure(const FailureScope& scope) {
  const Report report = describe_current_exception(scope);
  if (!report.text.empty()) std::fprintf(stderr, "%s\n", report.text.c_str());
  if (!scope.record_file.empty()) {
    // Best effort: the launcher falls back to the exit status when the file is missing.
    std::ofstream out(scope.record_file, std::ios::trunc);
    out << "exit " << report.code << "\n" << report.text << "\n";
  }
  return report.code;
}

}  // namespace trainer::app
