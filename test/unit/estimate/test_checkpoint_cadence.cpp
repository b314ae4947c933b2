// Checkpoint cadence advice (estimate/checkpoint_cadence.h, checkpoint_cost.h): the first-order
// formulas against hand-computed figures, Young's optimum really the least overhead, and the
// bytes one rank saves against a measured checkpoint.
#include <catch2/catch.hpp>

#include "estimate/checkpoint_cadence.h"
#include "estimate/checkpoint_cost.h"
#include "estimate/estimate.h"
#include "estimate_fixture.h"

using namespace trainer::estimate;
using trainer::test::load;

namespace {

// 64 GPUs at 50,000 h each: M = 50000 * 3600 / 64 = 2,812,500 s. A 5 s step, a 4 ms stall, a
// 60 s restart: Young's optimum sqrt(2 * 0.004 * 2812500) = sqrt(22500) = 150 s = 30 steps.
CadenceInputs example() {
  CadenceInputs in;
  in.gpus = 64;
  in.gpu_mtbf_hours = 50000;
  in.step_s = 5;
  in.run_steps = 100000;
  in.interval_steps = 1000;
  in.stall_s = 0.004;
  in.restart_s = 60;
  return in;
}

}  // namespace

TEST_CASE("checkpoint cadence: the hand-computed figures at the recipe's interval and at Young's optimum", "[estimate][checkpoint]") {
  const auto a = checkpoint_cadence(example());
  CHECK(a.job_mtbf_s == Approx(2812500));
  CHECK(a.run_s == Approx(500000));
  CHECK(a.failures_per_run == Approx(500000.0 / 2812500));
  CHECK(a.interval_s == Approx(5000));
  CHECK(a.lost_per_failure_s == Approx(2560));                       // 5000 / 2 + 60
  CHECK(a.overhead == Approx(0.004 / 5000 + 2560.0 / 2812500));      // 9.110e-4
  CHECK(a.optimum_s == Approx(150));
  CHECK(a.advised_steps == 30);
  CHECK(a.advised_interval_s == Approx(150));
  CHECK(a.advised_lost_per_failure_s == Approx(135));                // 150 / 2 + 60
  CHECK(a.advised_overhead == Approx(0.004 / 150 + 135.0 / 2812500));  // 7.467e-5
  CHECK(a.advised_overhead < a.overhead);
}

TEST_CASE("checkpoint cadence: the advised interval has the least overhead of all whole-step intervals", "[estimate][checkpoint]") {
  for (const double step_s : {5.0, 7.0, 0.37, 120.0}) {
    for (const double min_interval_s : {0.0, 40.0, 400.0}) {
      auto in = example();
      in.step_s = step_s;
      in.min_interval_s = min_interval_s;
      const auto a = checkpoint_cadence(in);
      INFO("step " << step_s << " s, min interval " << min_interval_s << " s: advised " << a.advised_steps << " steps");
      const auto overhead = [&](int64_t k) {
        return checkpoint_overhead(double(k) * step_s, in.stall_s, min_interval_s, in.restart_s, a.job_mtbf_s);
      };
      CHECK(a.advised_overhead == Approx(overhead(a.advised_steps)));
      const int64_t k = a.advised_steps;
      for (const int64_t other : {k - 1, k + 1, k - 5, k + 5, k / 2, 2 * k, 3 * k, int64_t(1)})
        if (other >= 1 && other != k) CHECK(overhead(other) > a.advised_overhead);
      // Nowhere in a wide range does a whole step beat it.
      for (int64_t other = std::max<int64_t>(1, k / 10); other <= 10 * k; ++other)
        CHECK(overhead(other) >= a.advised_overhead);
    }
  }
  // 7 s steps: 150 / 7 = 21.4; 21 steps (147 s) beats 22 (154 s).
  auto in = example();
  in.step_s = 7;
  CHECK(checkpoint_cadence(in).advised_steps == 21);
}

TEST_CASE("checkpoint cadence: an asynchronous save needs the previous write done - the optimum waits for it", "[estimate][checkpoint]") {
  auto in = example();
  in.min_interval_s = 400;  // above Young's 150 s
  const auto a = checkpoint_cadence(in);
  CHECK(a.optimum_s == Approx(400));
  CHECK(a.advised_steps == 80);
  CHECK(a.advised_overhead == Approx(0.004 / 400 + 260.0 / 2812500));
  // 79 steps (395 s) waits 5 s for the write at every save.
  CHECK(checkpoint_overhead(395, 0.004, 400, 60, a.job_mtbf_s) == Approx(5.004 / 395 + 257.5 / 2812500));
  CHECK(young_interval_s(0.004, 0, a.job_mtbf_s) == Approx(150));
  CHECK(young_interval_s(0.004, 400, a.job_mtbf_s) == Approx(400));
}

TEST_CASE("checkpoint cadence: interval 0 or checkpoints off lose about half the run per failure", "[estimate][checkpoint]") {
  auto in = example();
  in.interval_steps = 0;
  const auto end_only = checkpoint_cadence(in);
  CHECK(end_only.interval_s == Approx(500000));
  CHECK(end_only.lost_per_failure_s == Approx(250060));
  CHECK(end_only.overhead == Approx(0.004 / 500000 + 250060.0 / 2812500));  // 8.89%
  CHECK(end_only.advised_steps == 30);  // the advice does not depend on the recipe's interval

  in.interval_steps = 1000;
  in.enabled = false;  // no checkpoint.dir: no stall, and the whole run so far lost
  const auto off = checkpoint_cadence(in);
  CHECK(off.interval_s == Approx(500000));
  CHECK(off.overhead == Approx(250060.0 / 2812500));
  CHECK(off.advised_steps == 30);
  CHECK(off.advised_overhead == Approx(checkpoint_cadence(example()).advised_overhead));

  // An interval beyond the run is the run.
  in.enabled = true;
  in.interval_steps = 200000;
  CHECK(checkpoint_cadence(in).interval_s == Approx(500000));
}

TEST_CASE("checkpoint cadence: the job fails N times as often on N times the GPUs - the optimum shrinks as 1/sqrt(N)", "[estimate][checkpoint]") {
  CHECK(job_mtbf_s(50000, 1) == Approx(1.8e8));
  CHECK(job_mtbf_s(50000, 16384) == Approx(1.8e8 / 16384));
  auto in = example();
  const auto at64 = checkpoint_cadence(in);
  in.gpus = 256;
  const auto at256 = checkpoint_cadence(in);
  CHECK(at256.job_mtbf_s == Approx(at64.job_mtbf_s / 4));
  CHECK(at256.optimum_s == Approx(75));  // sqrt(2 * 0.004 * 703125)
  CHECK(at256.advised_steps == 15);
  CHECK(at256.failures_per_run == Approx(4 * at64.failures_per_run));
  CHECK(at256.overhead > at64.overhead);
}

TEST_CASE("checkpoint cadence: an optimum beyond the run is reported as it is", "[estimate][checkpoint]") {
  auto in = example();
  in.run_steps = 10;  // 50 s: shorter than the 150 s optimum
  const auto a = checkpoint_cadence(in);
  CHECK(a.advised_steps == 30);
  CHECK(a.advised_interval_s == Approx(50));  // saving only at the end
  CHECK(a.advised_overhead == Approx(0.004 / 50 + 85.0 / 2812500));
}

TEST_CASE("checkpoint cost: a rank's bytes are its share of parameters and optimizer state - as measured", "[estimate][checkpoint]") {
  // docs/checkpoint.md, "Who writes what": a DP=2 ZeRO-1 checkpoint of tiny-llama (fp32, AdamW):
  // 4,833,128 and 4,838,188 bytes per rank, with the safetensors headers, step counts and RNG state.
  const auto tiny = load("tiny-llama.json", {"parallel.zero=1"}, 2);
  const auto& gpu = builtin_profile("h100-sxm");
  const auto tiny_estimate = estimate_job(tiny.recipe, *tiny.mesh, &gpu);
  const double tiny_bytes = checkpoint_bytes_per_rank(tiny.recipe, tiny_estimate);
  CHECK(tiny_bytes == Approx(tiny_estimate.counts.total_params * 12.0 / 2));  // fp32 weights, two fp32 moments
  CHECK(tiny_bytes == Approx(4833128).epsilon(0.01));

  // Llama 3 8B on 64 GPUs (bf16, fp32 master weights and moments): 14 bytes per parameter, spread
  // over every rank whatever the ZeRO stage.
  const auto r = load("llama3-8b.json", {}, 64);
  const auto e = estimate_job(r.recipe, *r.mesh, &gpu);
  const double bytes = checkpoint_bytes_per_rank(r.recipe, e);
  CHECK(bytes == Approx(double(e.counts.total_params) * 14 / 64));
  const auto zero0 = load("llama3-8b.json", {"parallel.zero=0"}, 64);
  CHECK(checkpoint_bytes_per_rank(zero0.recipe, estimate_job(zero0.recipe, *zero0.mesh, &gpu)) == Approx(bytes));

  // Asynchronous: the snapshot copy hides behind the next step; the stall is the measured fixed part.
  const auto c = checkpoint_cost(r.recipe, e, gpu);
  CHECK(c.snapshot_s == Approx(bytes / gpu.host_d2h_bytes_per_s));
  CHECK(c.snapshot_s < c.hidden_s);
  CHECK(c.stall_s == Approx(kSnapshotStartS));
  CHECK(c.write_s == Approx(bytes / gpu.storage_bytes_per_s));
  CHECK(c.min_interval_s == Approx(c.snapshot_s + c.write_s));
  CHECK(c.restart_s == Approx(kRestartStartS + c.write_s));
  // Synchronous: training waits for the write.
  const auto sync = load("llama3-8b.json", {"checkpoint.async=false"}, 64);
  const auto cs = checkpoint_cost(sync.recipe, estimate_job(sync.recipe, *sync.mesh, &gpu), gpu);
  CHECK(cs.stall_s == Approx(c.write_s));
  CHECK(cs.min_interval_s == 0);

  const auto in = cadence_inputs(r.recipe, e, c);
  CHECK(in.gpus == 64);
  CHECK(in.gpu_mtbf_hours == r.recipe.hardware.gpu_mtbf_hours);
  CHECK(in.interval_steps == r.recipe.checkpoint.interval);
  CHECK(in.run_steps == r.recipe.training.steps);
  CHECK(in.enabled);
  CHECK(in.step_s == e.step_time_s);
}
