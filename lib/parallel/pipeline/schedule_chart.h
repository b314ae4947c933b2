#pragma once
// Pictures of a simulated step (simulate.h): a text chart with one row per stage on a time grid,
// like the figures of the pipeline papers, and a Chrome/Perfetto trace (chrome://tracing,
// ui.perfetto.dev) with one track per stage. Torch-free; `trainer schedule` prints them.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulate.h"

namespace trainer::parallel {

// One row per stage: each compute action's label in the column where it starts, '-' through the
// columns it lasts, '.' for idle columns. Labels are "F3" (forward of micro-batch 3), "B3"
// (backward), "I3" (input gradient, zero-bubble's B), "W3" (weight gradient), with the model chunk
// appended ("F3c5") when a stage holds more than one chunk. A column is the largest time step
// (the shortest action's duration divided by 1..12) on which every start and end falls; when none
// fits, times are rounded to the shortest duration. Below the rows: a legend and, per stage, busy
// and idle time, the bubble (idle / busy), peak in-flight activations and pending weight gradients.
std::string schedule_chart(const Simulation& sim);

// {"traceEvents": [...]} with one complete event (ph "X") per compute action: name as in
// to_string ("F3c0"), ts and dur in microseconds (one time unit of the costs =
// `microseconds_per_unit`), pid 0, tid = stage, args {micro_batch, chunk}; plus thread_name
// metadata naming each track "stage N".
nlohmann::json chrome_trace(const Simulation& sim, double microseconds_per_unit = 1000);

// Machine-readable result for `trainer schedule --json`: the spec, the makespan, and per stage
// its action list (with sends and receives), its timeline, busy and idle time, bubble and idle
// fractions, and peaks.
nlohmann::json schedule_json(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& stages,
                             const Simulation& sim);

}  // namespace trainer::parallel
