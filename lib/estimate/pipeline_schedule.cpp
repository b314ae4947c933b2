#include "estimate/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "parallel/pipeline/simulate.h"

namespace trainer::estimate {

namespace {

struct Figures {
  std::vector<int64_t> peak_inflight_chunks;  // per stage
  double bubble_fraction = 0;
};

const Figures& figures(parallel::ScheduleKind schedule, int64_t pp, int64_t vpp, int64_t microbatches) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t, int64_t>, Figures> cache;
  const auto key = std::make_tuple(int(schedule), pp, vpp, microbatches);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const parallel::ScheduleSpec spec{schedule, pp, vpp, microbatches};
  const parallel::Simulation sim = parallel::simulate(parallel::pipeline_schedule(spec));
  Figures f;
  for (const auto& stage : sim.stages) {
    f.peak_inflight_chunks.push_back(stage.peak_in_flight_chunks);
    f.bubble_fraction = std::max(f.bubble_fraction, stage.bubble_fraction);
  }
  return cache.emplace(key, std::move(f)).first->second;
}

}  // namespace

int64_t peak_inflight_chunks(parallel::ScheduleKind schedule, int64_t pp, int64_t vpp, int64_t stage,
                             int64_t microbatches) {
  if (stage < 0 || stage >= pp)
    throw std::invalid_argument(fmt::format("pipeline: stage {} of pp={} out of range", stage, pp));
  return figures(schedule, pp, vpp, microbatches).peak_inflight_chunks[size_t(stage)];
}

double bubble_fraction(parallel::ScheduleKind schedule, int64_t pp, int64_t vpp, int64_t microbatches) {
  return figures(schedule, pp, vpp, microbatches).bubble_fraction;
}

}  // namespace trainer::estimate
