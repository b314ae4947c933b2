#pragma once
// What a pipeline schedule implies for each stage: activations held at once and the bubble, from
// the runtime's own schedule generator and simulator (lib/parallel/pipeline: one source of truth,
// DESIGN.md invariant 7), simulated with equal costs per chunk (forward = input gradient = weight
// gradient). Torch-free; results are memoised, so the planner pays for each (schedule, pp, vpp,
// micro-batches) once.
#include <cstdint>

#include "parallel/pipeline/schedule.h"

namespace trainer::estimate {

// The most (micro-batch, chunk) forward activations stage `stage` holds at once (its forwards
// whose backward has not run): 1F1B pp - stage (capped at m), GPipe all m, interleaved
// 2 (pp - stage - 1) + (vpp - 1) pp + 1 where m is a multiple of pp.
int64_t peak_inflight_chunks(parallel::ScheduleKind schedule, int64_t pp, int64_t vpp, int64_t stage,
                             int64_t microbatches);

// Idle time relative to the ideal (bubble-free) step time of the busiest-idle stage: (pp - 1) / m
// for GPipe and 1F1B, (pp - 1) / (vpp m) for interleaved 1F1B where m is a multiple of pp, a third
// of 1F1B's for zero-bubble (ZB-H1). The step takes (1 + bubble) * m * t.
double bubble_fraction(parallel::ScheduleKind schedule, int64_t pp, int64_t vpp, int64_t microbatches);

}  // namespace trainer::estimate
