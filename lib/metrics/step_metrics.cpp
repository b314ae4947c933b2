#include "metrics/step_metrics.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "metrics/human_format.h"

namespace trainer::metrics {

namespace {

// Fixed decimals for ordinary magnitudes, scientific beyond them, so a tiny or exploding value
// stays readable ("0.812", "1.23e-05", "4.57e+04").
std::string format_number(double value, int decimals) {
  const double magnitude = std::abs(value);
  if (std::isfinite(value) && value != 0 && (magnitude < 1e-3 || magnitude >= 1e4))
    return fmt::format("{:.{}e}", value, 2);
  return fmt::format("{:.{}f}", value, decimals);
}

std::string format_tflops(double value) {
  if (std::abs(value) >= 10) return fmt::format("{:.1f}", value);
  if (std::abs(value) >= 0.1 || value == 0) return fmt::format("{:.2f}", value);
  return fmt::format("{:.2g}", value);
}

nlohmann::json finite_or_null(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

}  // namespace

std::string format_console_line(const StepMetrics& m) {
  return fmt::format("step {}/{} | loss {} | lr {:.2e} | gnorm {} | {} tok/s | {} TFLOP/s | mfu {} | mem {} | eta {}",
                     m.step, m.total_steps, format_number(m.loss, 4), m.lr, format_number(m.grad_norm, 3),
                     format_count(m.tokens_per_s), format_tflops(m.tflops_per_device),
                     m.mfu ? fmt::format("{:.1f}%", *m.mfu * 100) : std::string("-"), format_bytes(m.mem_peak_bytes),
                     format_duration(m.eta_s));
}

nlohmann::json to_json(const StepMetrics& m) {
  nlohmann::json j = {
      {"step", m.step},
      {"total_steps", m.total_steps},
      {"loss", finite_or_null(m.loss)},
      {"lr", finite_or_null(m.lr)},
      {"grad_norm", finite_or_null(m.grad_norm)},
      {"tokens_per_s", finite_or_null(m.tokens_per_s)},
      {"tflops_per_device", finite_or_null(m.tflops_per_device)},
      {"mfu", m.mfu ? finite_or_null(*m.mfu) : nlohmann::json()},
      {"mem_peak_bytes", m.mem_peak_bytes},
      {"time_s", finite_or_null(m.time_s)},
      {"eta_s", finite_or_null(m.eta_s)},
  };
  if (m.extra.is_null()) return j;
  if (!m.extra.is_object())
    throw std::invalid_argument("StepMetrics::extra must be a JSON object, not " + std::string(m.extra.type_name()));
  for (const auto& [key, value] : m.extra.items()) {
    if (j.contains(key))
      throw std::invalid_argument("StepMetrics::extra repeats the standard metrics key \"" + key + "\"");
    j[key] = value;
  }
  return j;
}

}  // namespace trainer::metrics
