#pragma once
// A discrete-event simulation of one optimizer step of a pipeline schedule (schedule.h): every
// stage runs its action list in order; a compute action takes its cost; a send never waits (its
// data arrives `latency` later); a receive waits until its data has arrived. From the timelines:
// the step's makespan, each stage's idle time (the bubble) and its peak in-flight activations.
// Torch-free; `trainer schedule`, the estimator and the schedule tests share it.
#include <cstdint>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace trainer::parallel {

// Time of one compute action on one model chunk, in any unit (the chart and trace treat one unit
// as one millisecond). A full Backward takes backward_input + backward_weight.
struct ChunkCosts {
  double forward = 1;
  double backward_input = 1;   // zero-bubble's B
  double backward_weight = 1;  // zero-bubble's W
};

struct SimulationCosts {
  ChunkCosts chunk;                  // every model chunk's costs, unless per_chunk is given
  std::vector<ChunkCosts> per_chunk;  // one entry per model chunk (uneven layouts, embedding, head)
  double latency = 0;                // from a send to its data's arrival at the receiver
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct StageTimeline {
  std::vector<TimedAction> compute;  // the stage's compute actions in order, with their times
  double busy = 0;                   // time spent computing
  double idle = 0;                   // makespan - busy: waiting, before, between and after
  // idle / busy: the bubble relative to this stage's ideal (bubble-free) time, the papers'
  // measure; (pp - 1) / m for GPipe and 1F1B with uniform costs.
  double bubble_fraction = 0;
  double idle_fraction = 0;  // idle / makespan
  // The most forwards whose backward (B, or the full backward) has not run yet, held at once:
  // counted in (micro-batch, chunk) activations, and in micro-batches' worth of this stage's
  // activations (chunks / the number of model chunks the stage holds). A forward without a
  // backward in the list (forward_only) keeps nothing: 0.
  int64_t peak_in_flight_chunks = 0;
  double peak_in_flight_micro_batches = 0;
  // The most input-gradient passes (BackwardInput) whose W has not run yet, held at once: the
  // activations zero-bubble keeps alive for its weight gradients.
  int64_t peak_pending_weight = 0;
};

struct Simulation {
  std::vector<StageTimeline> stages;  // index = stage
  double makespan = 0;                // when the last stage finishes
};

// Simulates `stages` (one action list per stage, as pipeline_schedule gives). Throws
// std::invalid_argument for negative costs, per_chunk entries missing a chunk the lists name, or
// indices that are negative or beyond 2^24 (micro-batch, chunk) pairs; std::logic_error
// "pipeline deadlock" naming each stage's stuck action when the lists cannot run to the end (a
// receive whose send never comes, or a cycle of waits).
Simulation simulate(const std::vector<std::vector<Action>>& stages, const SimulationCosts& costs = {});

}  // namespace trainer::parallel
