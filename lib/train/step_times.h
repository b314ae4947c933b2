#pragma once
// Where a step's time goes, measured on the host with cheap clock reads: building the micro-batches
// (data), forward and backward compute (the collectives inside them excluded), waiting on
// collectives (any Work::wait that blocked: exposed communication), the optimizer (clipping and
// the update), and the checkpoint stall (the fence and the snapshot that training waits for).
// On a GPU the host only enqueues kernels, so these are host-side figures (what the host waited
// for) until device-side timing lands; on the CPU they are the step's time.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace trainer::train {

struct StepTimes {
  double data_s = 0, forward_s = 0, backward_s = 0, comm_wait_s = 0, optimizer_s = 0, checkpoint_s = 0;
  // Collective waits by group name (comm::CommContext::waits_by_group) between two steps' figures:
  // every wait of comm_wait_s and also those outside the phases (the stop vote, evaluation), so
  // not one of the phases and at least comm_wait_s in sum.
  std::map<std::string, double> comm_wait_by_group_s;

  StepTimes& operator+=(const StepTimes& o) {
    data_s += o.data_s, forward_s += o.forward_s, backward_s += o.backward_s;
    comm_wait_s += o.comm_wait_s, optimizer_s += o.optimizer_s, checkpoint_s += o.checkpoint_s;
    for (const auto& [group, seconds] : o.comm_wait_by_group_s) comm_wait_by_group_s[group] += seconds;
    return *this;
  }
  StepTimes scaled(double factor) const {
    StepTimes t = *this;
    t.data_s *= factor, t.forward_s *= factor, t.backward_s *= factor;
    t.comm_wait_s *= factor, t.optimizer_s *= factor, t.checkpoint_s *= factor;
    for (auto& [group, seconds] : t.comm_wait_by_group_s) seconds *= factor;
    return t;
  }
  double total() const { return data_s + forward_s + backward_s + comm_wait_s + optimizer_s + checkpoint_s; }
};

// A stopwatch that leaves out the time spent waiting on collectives (comm::CommContext::wait_ns,
// counted by the communicators), so that phases and the communication wait add up without overlap.
class PhaseClock {
 public:
  explicit PhaseClock(const std::atomic<int64_t>& wait_ns)
      : wait_ns_(wait_ns), start_(std::chrono::steady_clock::now()), wait_start_(wait_ns.load()) {}
  // Seconds since construction (or the last restart), collective waits excluded.
  double seconds() const {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return wall - waited();
  }
  // Seconds of collective waits since construction (or the last restart).
  double waited() const { return double(wait_ns_.load() - wait_start_) * 1e-9; }
  void restart() {
    start_ = std::chrono::steady_clock::now();
    wait_start_ = wait_ns_.load();
  }
  // Adds the phase since the last restart to *phase and its collective waits to *waits; restarts.
  void lap(double* phase, double* waits) {
    *phase += seconds();
    *waits += waited();
    restart();
  }

 private:
  const std::atomic<int64_t>& wait_ns_;
  std::chrono::steady_clock::time_point start_;
  int64_t wait_start_;
};

}  // namespace trainer::train
