#include "runtime/stop_signal.h"

#include <atomic>
#include <csignal>

namespace trainer::runtime {

namespace {
std::atomic<int> g_signal{0};  // the one piece of process state a signal handler may touch

extern "C" void on_stop_signal(int signal) {
  if (g_signal.exchange(signal) != 0) {
    // Second signal: stop now.
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
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
void StopSignal::request(int signal) { g_signal.store(signal); }

}  // namespace trainer::runtime
