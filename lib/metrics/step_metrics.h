#pragma once
// What rank 0 reports for one logged step, and its two renderings: the compact console line and
// the JSON object written to the metrics file (DESIGN.md section 2).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace trainer::metrics {

struct StepMetrics {
  int64_t step = 0;               // 1-based number of the step just finished
  int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;                  // the learning rate the step used
  double grad_norm = 0;           // global norm before clipping
  double tokens_per_s = 0;        // the whole job's tokens per second
  double tflops_per_device = 0;   // model TFLOP/s per device
  std::optional<double> mfu;      // fraction of the dense peak; none on a CPU or an unknown GPU
  int64_t mem_peak_bytes = 0;     // peak tensor memory of this rank's device (CPU or GPU)
  double time_s = 0;              // wall time of the step
  double eta_s = 0;               // estimated time to the last step
  nlohmann::json extra;           // further keys for the metrics file (an object, or null for none)
};

// One line, no newline:
// "step 20/60 | loss 2.3456 | lr 2.95e-03 | gnorm 0.812 | 12.3k tok/s | 0.45 TFLOP/s | mfu - | mem 123.4 MiB | eta 0:00:41"
// mfu prints as a percentage ("mfu 41.2%"), or "-" when unknown. `extra` is not shown.
std::string format_console_line(const StepMetrics& m);

// {"step", "total_steps", "loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_device", "mfu",
//  "mem_peak_bytes", "time_s", "eta_s"} and the keys of `extra` (nlohmann::json keeps keys sorted,
// so a dumped line lists them alphabetically). A non-finite number (a NaN loss) and an unknown mfu
// are null. Throws std::invalid_argument when `extra` is neither an object
// nor null, or repeats one of the standard keys.
nlohmann::json to_json(const StepMetrics& m);

}  // namespace trainer::metrics
