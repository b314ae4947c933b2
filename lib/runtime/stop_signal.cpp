#include "runtime/stop_signal.h"

#include <time.h>

#include <atomic>
#include <csignal>
#include <cstdint>

namespace trainer::runtime {

namespace {
// The only process state the signal handler touches (lock-free atomics).
std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};

// A terminal's Ctrl-C reaches the whole foreground process group, and launchers (ours, mpirun,
// srun) forward it to their workers as well: one keypress arrives twice within milliseconds.
// Only a signal at least this long after the first one is a second request.
constexpr int64_t kSameRequestNs = 1'000'000'000;

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

extern "C" void on_stop_signal(int signal) {
  const int64_t now = monotonic_ns();
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, signal)) {
    g_first_ns.store(now);
    return;
  }
  if (now - g_first_ns.load() < kSameRequestNs) return;  // the same request, delivered twice
  // A second request: stop now.
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}
}  // namespace

void StopSignal::install() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

bool StopSignal::requested() { return g_signal.load() != 0; }
int StopSignal::signal_number() { return g_signal.load(); }
void StopSignal::request(int signal) {
  g_first_ns.store(monotonic_ns());
  g_signal.store(signal);
}

}  // namespace trainer::runtime
