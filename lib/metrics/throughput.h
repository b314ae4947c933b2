#pragma once
// From one step's wall time to tokens/s, achieved TFLOP/s per device and MFU (model FLOPs
// utilisation). The FLOPs per token come from estimate::count_model, the same numbers the
// estimator uses; the peak from gpu_peaks.h.
#include <cstdint>
#include <optional>

namespace trainer::metrics {

struct Throughput {
  double tokens_per_s = 0;        // tokens of the whole job (all ranks together) per second
  double tflops_per_device = 0;   // model TFLOP/s achieved per device (job total / devices)
  std::optional<double> mfu;      // tflops_per_device / peak, a fraction (0.41 = 41%); none without a peak
};

// `tokens`: tokens trained in the step by the whole job (global batch size * seq_len);
// `seconds`: the step's wall time; `flops_per_token`: ModelCounts::flops_per_token; `devices`: the
// ranks the work is spread over (the world size); `peak_tflops`: one device's dense peak for the
// training dtype, none on a CPU or an unknown GPU. Throws std::invalid_argument when seconds <= 0
// or devices <= 0.
Throughput measure_throughput(int64_t tokens, double seconds, double flops_per_token, int64_t devices,
                              std::optional<double> peak_tflops);

}  // namespace trainer::metrics
