#pragma once
// How often to checkpoint: the work a failure costs at a checkpoint interval, and the interval that
// minimises that loss plus the checkpoint stalls (Young's first-order optimum). Pure arithmetic on
// a few figures; checkpoint_cost.h derives them from a recipe and its estimate. Torch-free.
//
// With a job of N GPUs each failing every gpu_mtbf_hours (exponential, independent), the job
// fails every M = gpu_mtbf_hours * 3600 / N seconds. Checkpointing every tau seconds of training,
// each save stalls training delta seconds and each failure costs the work since the last
// checkpoint (tau / 2 on average) plus the restart R. To first order in tau / M:
//
//   work lost per failure   tau / 2 + R
//   overhead (of the run)   delta / tau + (tau / 2 + R) / M
//   optimum (Young 1974)    tau* = sqrt(2 delta M)
//
// An asynchronous save that comes before the previous one's write has finished waits for it, so
// delta grows by (min_interval - tau) below min_interval: the optimum is then at least
// min_interval. The advised interval is the whole number of steps (at least 1) with the least
// overhead. These are first-order figures: they understate the overhead when tau is not small
// against M (a run without checkpoints that is longer than M mostly fails).
#include <cstdint>

namespace trainer::estimate {

struct CadenceInputs {
  int64_t gpus = 1;             // N
  double gpu_mtbf_hours = 0;    // per GPU (hardware.gpu_mtbf_hours)
  double step_s = 0;            // one optimizer step
  int64_t run_steps = 0;        // training.steps
  // checkpoint.interval; 0 (or not below run_steps): only at the end of the run, so a failure
  // loses about half the run. With checkpoints off (enabled false) a failure loses the whole run
  // so far: the same figures, with no stall.
  int64_t interval_steps = 0;
  bool enabled = true;          // checkpoint.dir set
  double stall_s = 0;           // delta: what training waits for per save
  double min_interval_s = 0;    // saves closer together than this also wait for the previous write
  double restart_s = 0;         // R: from a failure to training again
};

struct CadenceAdvice {
  double job_mtbf_s = 0;            // M
  double run_s = 0;                 // run_steps * step_s
  double failures_per_run = 0;      // run_s / M (first order)
  // At the recipe's interval.
  double interval_s = 0;            // tau (the run's length when only at the end or off)
  double lost_per_failure_s = 0;    // tau / 2 + R
  double overhead = 0;              // fraction of the run
  // At the advised interval.
  double optimum_s = 0;             // max(sqrt(2 delta M), min_interval): the continuous optimum
  int64_t advised_steps = 1;        // whole steps, at least 1 (may exceed run_steps)
  double advised_interval_s = 0;    // min(advised_steps, run_steps) * step_s
  double advised_lost_per_failure_s = 0;
  double advised_overhead = 0;
};

// Seconds between failures of a job of `gpus` GPUs: gpu_mtbf_hours * 3600 / gpus.
double job_mtbf_s(double gpu_mtbf_hours, int64_t gpus);

// delta / tau + (tau / 2 + R) / M, with delta + max(0, min_interval - tau) per save (tau > 0).
double checkpoint_overhead(double interval_s, double stall_s, double min_interval_s, double restart_s,
                           double job_mtbf_s);

// Young's optimum sqrt(2 delta M), not below min_interval.
double young_interval_s(double stall_s, double min_interval_s, double job_mtbf_s);

// Preconditions: gpus >= 1, gpu_mtbf_hours > 0, step_s > 0, run_steps >= 1.
CadenceAdvice checkpoint_cadence(const CadenceInputs& inputs);

}  // namespace trainer::estimate
