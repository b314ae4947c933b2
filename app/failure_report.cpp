#include "failure_report.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>

#include "core/error.h"
#include "runtime/stop_signal.h"

namespace trainer::app {

int report_failure(const FailureScope& scope) {
  const std::string rank = scope.rank ? fmt::format("rank {}: ", *scope.rank) : "";
  try {
    throw;
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s\n", prefix_lines(e.what(), rank + "error: ").c_str());
    return kExitUsageError;
  } catch (const TrainingFailure& e) {
    std::fprintf(stderr, "%straining failed: %s\n", rank.c_str(), e.what());
    return kExitRuntimeFailure;
  } catch (const runtime::Interrupted& e) {
    if (scope.print_interrupt) std::fprintf(stderr, "%s\n", e.what());
    return e.exit_code();  // 130 for SIGINT, 143 for SIGTERM, as a shell reports a process they killed
  } catch (const std::exception& e) {
    const std::string text = e.what();
    if (!scope.rank)
      std::fprintf(stderr, "internal error: %s\n", text.c_str());
    else  // a rank's failure may name its rank already (a collective's error does)
      std::fprintf(stderr, "%s%s\n", text.rfind("rank ", 0) == 0 ? "" : rank.c_str(), text.c_str());
    return kExitRuntimeFailure;
  } catch (...) {
    std::fprintf(stderr, "%sinternal error: unknown exception\n", rank.c_str());
    return kExitRuntimeFailure;
  }
}

}  // namespace trainer::app
