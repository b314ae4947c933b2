#include "estimate/checkpoint_cadence.h"

#include <algorithm>
#include <cmath>

namespace trainer::estimate {

double job_mtbf_s(double gpu_mtbf_hours, int64_t gpus) { return gpu_mtbf_hours * 3600.0 / double(gpus); }

double checkpoint_overhead(double interval_s, double stall_s, double min_interval_s, double restart_s,
                           double job_mtbf_s) {
  const double stall = stall_s + std::max(0.0, min_interval_s - interval_s);
  return stall / interval_s + (interval_s / 2 + restart_s) / job_mtbf_s;
}

double young_interval_s(double stall_s, double min_interval_s, double job_mtbf_s) {
  return std::max(std::sqrt(2 * stall_s * job_mtbf_s), min_interval_s);
}

CadenceAdvice checkpoint_cadence(const CadenceInputs& in) {
  CadenceAdvice a;
  a.job_mtbf_s = job_mtbf_s(in.gpu_mtbf_hours, in.gpus);
  a.run_s = double(in.run_steps) * in.step_s;
  a.failures_per_run = a.run_s / a.job_mtbf_s;
  // Seconds between saves of `steps` (the run's end bounds every interval).
  const auto interval_of = [&](int64_t steps) { return double(std::min(steps, in.run_steps)) * in.step_s; };
  const auto overhead_of = [&](double tau, bool saves) {
    return checkpoint_overhead(tau, saves ? in.stall_s : 0.0, saves ? in.min_interval_s : 0.0, in.restart_s,
                               a.job_mtbf_s);
  };

  const bool periodic = in.enabled && in.interval_steps > 0;
  a.interval_s = periodic ? interval_of(in.interval_steps) : a.run_s;
  a.lost_per_failure_s = a.interval_s / 2 + in.restart_s;
  a.overhead = overhead_of(a.interval_s, in.enabled);

  // The overhead is convex in tau beyond min_interval and falls below it, so the best whole number
  // of steps is next to Young's optimum or to min_interval: try the steps on either side of both.
  a.optimum_s = young_interval_s(in.stall_s, in.min_interval_s, a.job_mtbf_s);
  double best = INFINITY;
  for (const double tau : {a.optimum_s, in.min_interval_s}) {
    const double steps = tau / in.step_s;
    // Beyond the run every interval is the run's length: no need to count past it.
    for (const double candidate : {std::floor(steps), std::ceil(steps)}) {
      const auto k = int64_t(std::clamp(candidate, 1.0, double(in.run_steps) + 1.0));
      const double overhead = overhead_of(interval_of(k), true);
      if (overhead < best) {
        best = overhead;
        a.advised_steps = k;
      }
    }
  }
  if (a.advised_steps > in.run_steps)  // longer than the run: report the optimum itself
    a.advised_steps = int64_t(std::clamp(std::ceil(a.optimum_s / in.step_s), double(a.advised_steps), 1e15));
  a.advised_interval_s = interval_of(a.advised_steps);
  a.advised_lost_per_failure_s = a.advised_interval_s / 2 + in.restart_s;
  a.advised_overhead = best;
  return a;
}

}  // namespace trainer::estimate
