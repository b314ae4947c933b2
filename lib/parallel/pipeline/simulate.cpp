#include "parallel/pipeline/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::parallel {

namespace {

using K = Action::Kind;

const ChunkCosts& costs_of(const SimulationCosts& costs, int64_t chunk) {
  if (costs.per_chunk.empty()) return costs.chunk;
  if (chunk >= static_cast<int64_t>(costs.per_chunk.size()))
    throw std::invalid_argument(
        fmt::format("simulate: no costs for model chunk {} ({} given)", chunk, costs.per_chunk.size()));
  return costs.per_chunk[chunk];
}

double duration(const SimulationCosts& costs, const Action& a) {
  const ChunkCosts& c = costs_of(costs, a.chunk);
  switch (a.kind) {
    case K::Forward: return c.forward;
    case K::Backward: return c.backward_input + c.backward_weight;
    case K::BackwardInput: return c.backward_input;
    case K::BackwardWeight: return c.backward_weight;
    default: return 0;
  }
}

void check_costs(const SimulationCosts& costs) {
  const auto check = [](const ChunkCosts& c) {
    if (c.forward < 0 || c.backward_input < 0 || c.backward_weight < 0)
      throw std::invalid_argument(fmt::format("simulate: negative cost (forward {}, backward input {}, weight {})",
                                              c.forward, c.backward_input, c.backward_weight));
  };
  check(costs.chunk);
  for (const ChunkCosts& c : costs.per_chunk) check(c);
  if (costs.latency < 0) throw std::invalid_argument(fmt::format("simulate: negative latency {}", costs.latency));
}

}  // namespace

Simulation simulate(const std::vector<std::vector<Action>>& stages, const SimulationCosts& costs) {
  check_costs(costs);
  const size_t pp = stages.size();
  int64_t micro_batches = 0, chunks = 0;
  for (const auto& actions : stages)
    for (const Action& a : actions) {
      if (a.micro_batch < 0 || a.chunk < 0)
        throw std::invalid_argument(fmt::format("simulate: {} has a negative index", to_string(a)));
      micro_batches = std::max(micro_batches, a.micro_batch + 1);
      chunks = std::max(chunks, a.chunk + 1);
    }
  if (micro_batches * chunks > (int64_t{1} << 24))  // the tables below are dense
    throw std::invalid_argument(fmt::format("simulate: indices up to micro-batch {} and chunk {} are too large",
                                            micro_batches - 1, chunks - 1));
  // When each (activation or gradient, micro-batch, chunk) arrives; negative: not sent yet.
  std::vector<double> arrival(2 * micro_batches * chunks, -1);
  const auto data = [&](const Action& a) {
    const bool gradient = a.kind == K::SendBackward || a.kind == K::RecvBackward;
    return ((gradient ? micro_batches : 0) + a.micro_batch) * chunks + a.chunk;
  };
  std::vector<size_t> next(pp, 0);
  std::vector<double> clock(pp, 0);
  Simulation sim;
  sim.stages.resize(pp);
  // A stage's times depend only on its own earlier actions and on when its receives' data arrives,
  // so the stages can advance in any order: each runs until a receive whose send has not been
  // simulated yet, and the rounds repeat until all are done or none moves (a deadlock).
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < pp; ++s) {
      for (; next[s] < stages[s].size(); ++next[s], progress = true) {
        const Action& a = stages[s][next[s]];
        if (a.kind == K::SendForward || a.kind == K::SendBackward) {
          arrival[data(a)] = clock[s] + costs.latency;
        } else if (a.kind == K::RecvForward || a.kind == K::RecvBackward) {
          if (arrival[data(a)] < 0) break;
          clock[s] = std::max(clock[s], arrival[data(a)]);
        } else {
          const double d = duration(costs, a);
          sim.stages[s].compute.push_back({a, clock[s], clock[s] + d});
          clock[s] += d;
          sim.stages[s].busy += d;
        }
      }
    }
  }
  std::string stuck;
  for (size_t s = 0; s < pp; ++s)
    if (next[s] < stages[s].size())
      stuck += fmt::format("; stage {} waits at {} (action {} of {})", s, to_string(stages[s][next[s]]), next[s],
                           stages[s].size());
  if (!stuck.empty()) throw std::logic_error("pipeline deadlock" + stuck);

  for (size_t s = 0; s < pp; ++s)
    if (!sim.stages[s].compute.empty()) sim.makespan = std::max(sim.makespan, sim.stages[s].compute.back().end);
  for (size_t s = 0; s < pp; ++s) {
    StageTimeline& t = sim.stages[s];
    t.idle = sim.makespan - t.busy;
    t.bubble_fraction = t.busy > 0 ? t.idle / t.busy : 0;
    t.idle_fraction = sim.makespan > 0 ? t.idle / sim.makespan : 0;
    // A forward holds its activations only for a backward to come: a forward-only list holds none.
    std::vector<char> backwarded(micro_batches * chunks, 0), holds_chunk(chunks, 0);
    for (const TimedAction& ta : t.compute)
      if (ta.action.kind == K::Backward || ta.action.kind == K::BackwardInput)
        backwarded[ta.action.micro_batch * chunks + ta.action.chunk] = 1;
    int64_t in_flight = 0, pending_weight = 0;
    for (const TimedAction& ta : t.compute) {
      switch (ta.action.kind) {
        case K::Forward: in_flight += backwarded[ta.action.micro_batch * chunks + ta.action.chunk]; break;
        case K::Backward: --in_flight; break;
        case K::BackwardInput:
          --in_flight;
          ++pending_weight;
          break;
        case K::BackwardWeight: --pending_weight; break;
        default: break;
      }
      holds_chunk[ta.action.chunk] = 1;
      t.peak_in_flight_chunks = std::max(t.peak_in_flight_chunks, in_flight);
      t.peak_pending_weight = std::max(t.peak_pending_weight, pending_weight);
    }
    const auto held = std::count(holds_chunk.begin(), holds_chunk.end(), 1);
    t.peak_in_flight_micro_batches =
        held == 0 ? 0 : static_cast<double>(t.peak_in_flight_chunks) / static_cast<double>(held);
  }
  return sim;
}

}  // namespace trainer::parallel
