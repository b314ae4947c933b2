#include "metrics/human_format.h"

#include <fmt/format.h>

#include <array>
#include <cmath>

namespace trainer::metrics {

std::string format_bytes(int64_t bytes) {
  if (bytes < 1024 && bytes > -1024) return fmt::format("{} B", bytes);
  static constexpr std::array<const char*, 5> kUnits = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (std::abs(value) >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_count(double value) {
  if (!std::isfinite(value)) return fmt::format("{}", value);
  const double magnitude = std::abs(value);
  if (magnitude < 1e3) return fmt::format("{:.0f}", value);
  static constexpr std::array<std::pair<double, const char*>, 4> kSteps = {
      {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}}};
  for (const auto& [scale, suffix] : kSteps) {
    if (magnitude >= scale) {
      const double scaled = value / scale;
      // Three significant digits: 1.23k, 12.3k, 123k.
      const int decimals = std::abs(scaled) >= 100 ? 0 : std::abs(scaled) >= 10 ? 1 : 2;
      return fmt::format("{:.{}f}{}", scaled, decimals, suffix);
    }
  }
  return fmt::format("{:.0f}", value);  // unreachable: magnitude >= 1e3 matched "k"
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
}

}  // namespace trainer::metrics
