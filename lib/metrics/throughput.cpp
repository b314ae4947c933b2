#include "metrics/throughput.h"

#include <fmt/format.h>

#include <stdexcept>

namespace trainer::metrics {

Throughput measure_throughput(int64_t tokens, double seconds, double flops_per_token, int64_t devices,
                              std::optional<double> peak_tflops) {
  if (!(seconds > 0)) throw std::invalid_argument(fmt::format("measure_throughput: seconds={} must be positive", seconds));
  if (devices <= 0) throw std::invalid_argument(fmt::format("measure_throughput: devices={} must be positive", devices));
  Throughput t;
  t.tokens_per_s = static_cast<double>(tokens) / seconds;
  t.tflops_per_device = t.tokens_per_s * flops_per_token / static_cast<double>(devices) / 1e12;
  if (peak_tflops && *peak_tflops > 0) t.mfu = t.tflops_per_device / *peak_tflops;
  return t;
}

}  // namespace trainer::metrics
