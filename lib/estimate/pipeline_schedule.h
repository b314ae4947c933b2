#pragma once
// What a pipeline schedule implies for one stage, in closed form: forwards before the first
// backward, activations held at once, and the bubble. Torch-free and shared by the estimator and
// the runtime's schedule tests (DESIGN.md invariant 7). Sources: Narayanan et al. 2021 (1F1B and
// interleaved 1F1B, Megatron-LM's schedules.py), Huang et al. 2019 (GPipe).
#include <cstdint>
#include <string>

namespace trainer::estimate {

enum class Schedule { GPipe, OneFOneB, Interleaved };

// "gpipe", "1f1b", "interleaved_1f1b" (the recipe's parallel.pipeline_schedule).
Schedule parse_schedule(const std::string& name);
const char* schedule_name(Schedule schedule);

// Forward passes of (micro-batch, model chunk) pairs stage `stage` (0-based) runs before its first
// backward, with `microbatches` micro-batches per step and `vpp` chunks per stage:
//   GPipe: all m * vpp; 1F1B: min(pp - stage - 1, m); interleaved: min(2 (pp - stage - 1) +
//   (vpp - 1) pp, m vpp). With pp = 1 every schedule runs one forward then its backward: 0.
int64_t warmup_forwards(Schedule schedule, int64_t pp, int64_t vpp, int64_t stage, int64_t microbatches);

// The most (micro-batch, chunk) forward activations stage `stage` holds at once: warm-up + 1,
// capped at m * vpp (GPipe: m * vpp). Stage 0 of 1F1B holds min(pp, m); of interleaved
// pp + (pp - 1) / vpp micro-batches' worth (in chunk units: pp vpp + pp - 1).
int64_t peak_inflight_chunks(Schedule schedule, int64_t pp, int64_t vpp, int64_t stage, int64_t microbatches);

// Idle fraction relative to the ideal step time m * t: (pp - 1) / m for GPipe and 1F1B,
// (pp - 1) / (vpp m) for interleaved 1F1B. The step takes (1 + bubble) * m * t.
double bubble_fraction(Schedule schedule, int64_t pp, int64_t vpp, int64_t microbatches);

}  // namespace trainer::estimate
