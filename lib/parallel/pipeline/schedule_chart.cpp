#include "parallel/pipeline/schedule_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace trainer::parallel {

namespace {

bool on_grid(double t, double step) { return std::fabs(t / step - std::round(t / step)) < 1e-6; }

// The column width in time: see schedule_chart in the header.
double grid_step(const Simulation& sim) {
  double shortest = 0;
  for (const StageTimeline& t : sim.stages)
    for (const TimedAction& a : t.compute)
      if (a.end > a.start && (shortest == 0 || a.end - a.start < shortest)) shortest = a.end - a.start;
  if (shortest == 0) return 1;
  for (int divisor = 1; divisor <= 12; ++divisor) {
    const double step = shortest / divisor;
    bool fits = true;
    for (const StageTimeline& t : sim.stages)
      for (const TimedAction& a : t.compute) fits = fits && on_grid(a.start, step) && on_grid(a.end, step);
    if (fits) return step;
  }
  return shortest;
}

// Short labels ("F3") when every stage holds one chunk, else with the chunk ("F3c5").
std::string label(const Action& a, bool with_chunk) {
  std::string text = to_string(a);
  return with_chunk ? text : text.substr(0, text.rfind('c'));
}

}  // namespace

std::string schedule_chart(const Simulation& sim) {
  bool with_chunk = false;
  size_t width = 1;
  for (const StageTimeline& t : sim.stages) {
    std::set<int64_t> chunks;
    for (const TimedAction& a : t.compute) chunks.insert(a.action.chunk);
    with_chunk = with_chunk || chunks.size() > 1;
  }
  for (const StageTimeline& t : sim.stages)
    for (const TimedAction& a : t.compute) width = std::max(width, label(a.action, with_chunk).size());
  const double step = grid_step(sim);
  const auto column = [&](double t) { return static_cast<size_t>(std::llround(t / step)); };
  const size_t columns = column(sim.makespan);

  std::string out;
  for (size_t s = 0; s < sim.stages.size(); ++s) {
    // One cell of `width` + 1 characters per column: a label, its continuation, or idle.
    std::vector<std::string> cells(columns, fmt::format("{:<{}}", ".", width));
    for (const TimedAction& a : sim.stages[s].compute) {
      const size_t first = column(a.start), last = std::max(column(a.end), first + 1);
      for (size_t c = first; c < last && c < columns; ++c)
        cells[c] = c == first ? fmt::format("{:<{}}", label(a.action, with_chunk), width) : std::string(width, '-');
    }
    std::string row = fmt::format("stage {:<3}|", s);
    for (const std::string& cell : cells) row += cell + " ";
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  out += fmt::format(
      "one column = {:g} time unit{}; F forward, B backward, I input gradient (zero-bubble B), W weight gradient{}; "
      ". idle\n",
      step, step == 1 ? "" : "s", with_chunk ? ", cN model chunk N" : "");
  out += fmt::format("step time {:g}\n", sim.makespan);
  out += fmt::format("{:<6} {:>10} {:>10} {:>8} {:>16} {:>14} {:>10}\n", "stage", "busy", "idle", "bubble",
                     "in-flight chunks", "(micro-batches)", "pending W");
  for (size_t s = 0; s < sim.stages.size(); ++s) {
    const StageTimeline& t = sim.stages[s];
    out += fmt::format("{:<6} {:>10g} {:>10g} {:>7.1f}% {:>16} {:>14.2f} {:>10}\n", s, t.busy, t.idle,
                       100 * t.bubble_fraction, t.peak_in_flight_chunks, t.peak_in_flight_micro_batches,
                       t.peak_pending_weight);
  }
  return out;
}

nlohmann::json chrome_trace(const Simulation& sim, double microseconds_per_unit) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t s = 0; s < sim.stages.size(); ++s) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", s},
                      {"args", {{"name", fmt::format("stage {}", s)}}}});
    for (const TimedAction& a : sim.stages[s].compute)
      events.push_back({{"name", to_string(a.action)},
                        {"ph", "X"},
                        {"ts", a.start * microseconds_per_unit},
                        {"dur", (a.end - a.start) * microseconds_per_unit},
                        {"pid", 0},
                        {"tid", s},
                        {"args", {{"micro_batch", a.action.micro_batch}, {"chunk", a.action.chunk}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

nlohmann::json schedule_json(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& stages,
                             const Simulation& sim) {
  nlohmann::json out = {{"schedule", schedule_name(spec.kind)},
                        {"pp", spec.pp},
                        {"vpp", spec.vpp},
                        {"micro_batches", spec.micro_batches},
                        {"first_chunk_stage", first_chunk_stage(spec.kind, spec.pp, spec.vpp)},
                        {"last_chunk_stage", last_chunk_stage(spec.kind, spec.pp, spec.vpp)},
                        {"step_time", sim.makespan},
                        {"stages", nlohmann::json::array()}};
  for (size_t s = 0; s < sim.stages.size(); ++s) {
    const StageTimeline& t = sim.stages[s];
    nlohmann::json timeline = nlohmann::json::array();
    for (const TimedAction& a : t.compute)
      timeline.push_back({{"action", to_string(a.action)}, {"start", a.start}, {"end", a.end}});
    out["stages"].push_back({{"stage", s},
                             {"actions", s < stages.size() ? to_string(stages[s]) : ""},
                             {"timeline", timeline},
                             {"busy", t.busy},
                             {"idle", t.idle},
                             {"bubble_fraction", t.bubble_fraction},
                             {"idle_fraction", t.idle_fraction},
                             {"peak_in_flight_chunks", t.peak_in_flight_chunks},
                             {"peak_in_flight_micro_batches", t.peak_in_flight_micro_batches},
                             {"peak_pending_weight", t.peak_pending_weight}});
  }
  return out;
}

}  // namespace trainer::parallel
