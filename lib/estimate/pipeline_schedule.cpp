#include "estimate/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::estimate {

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "interleaved_1f1b") return Schedule::Interleaved;
  // Until the estimator runs the simulator (lib/parallel/pipeline/simulate.h): zero-bubble holds
  // 1F1B's activations (its smaller bubble is not credited); zbv holds two chunks per stage like
  // interleaving with vpp 2.
  if (name == "zero_bubble") return Schedule::OneFOneB;
  if (name == "zbv") return Schedule::Interleaved;
  throw std::invalid_argument(fmt::format("unknown pipeline schedule \"{}\"", name));
}

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
    case Schedule::Interleaved: return "interleaved_1f1b";
  }
  return "?";
}

namespace {
void check(int64_t pp, int64_t vpp, int64_t stage, int64_t microbatches) {
  if (pp < 1 || vpp < 1 || microbatches < 1 || stage < 0 || stage >= pp)
    throw std::invalid_argument(
        fmt::format("pipeline: pp={} vpp={} stage={} microbatches={} out of range", pp, vpp, stage, microbatches));
}
}  // namespace

int64_t warmup_forwards(Schedule schedule, int64_t pp, int64_t vpp, int64_t stage, int64_t microbatches) {
  check(pp, vpp, stage, microbatches);
  const int64_t total = microbatches * vpp;
  if (pp == 1) return schedule == Schedule::GPipe ? total : 0;
  switch (schedule) {
    case Schedule::GPipe: return total;
    case Schedule::OneFOneB: return std::min(pp - stage - 1, microbatches);
    case Schedule::Interleaved: return std::min(2 * (pp - stage - 1) + (vpp - 1) * pp, total);
  }
  return 0;
}

int64_t peak_inflight_chunks(Schedule schedule, int64_t pp, int64_t vpp, int64_t stage, int64_t microbatches) {
  const int64_t total = microbatches * vpp;
  if (schedule == Schedule::GPipe) return total;
  return std::min(warmup_forwards(schedule, pp, vpp, stage, microbatches) + 1, total);
}

double bubble_fraction(Schedule schedule, int64_t pp, int64_t vpp, int64_t microbatches) {
  check(pp, vpp, 0, microbatches);
  const double idle = double(pp - 1) / double(microbatches);
  return schedule == Schedule::Interleaved ? idle / double(vpp) : idle;
}

}  // namespace trainer::estimate
