#include "runtime/stop_signal.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace trainer::runtime {

namespace {
// The only process state the signal handlers touch (lock-free atomics and a path written before
// it is armed).
std::atomic<int> g_signal{0};
std::atomic<int64_t> g_first_ns{0};
std::atomic<bool> g_acknowledge{false}, g_checkpoint{false};
std::atomic<int64_t> g_stop_step{0};
std::atomic<bool> g_remove_armed{false};
char g_remove_path[4096];
char g_remove_marker[256];  // the file is removed only while it still holds this ("" : always)
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handlers need lock-free atomics");

// A terminal's Ctrl-C reaches the whole foreground process group, and launchers (ours, mpirun,
// srun) forward it to their workers as well: one keypress arrives twice within milliseconds.
// Only a signal at least this long after the first one is a second request.
constexpr int64_t kSameRequestNs = 1'000'000'000;

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  return int64_t(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

// Async-signal-safe text building: a fixed buffer, no allocation, no locale.
struct Text {
  char data[512];
  size_t size = 0;
  void add(const char* s) {
    for (; *s && size + 1 < sizeof(data); ++s) data[size++] = *s;
  }
  void add(int64_t value) {
    char digits[24];
    int n = 0;
    uint64_t v = value < 0 ? uint64_t(-value) : uint64_t(value);
    do digits[n++] = char('0' + v % 10); while ((v /= 10) && n < 23);
    if (value < 0) add("-");
    while (n > 0 && size + 1 < sizeof(data)) data[size++] = digits[--n];
  }
  void write_to(int fd) const {
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd, data + done, size - done);
      if (n <= 0) return;
      done += size_t(n);
    }
  }
};

const char* short_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

void acknowledge(int signal) {
  Text text;
  text.add("\nstop requested (");
  text.add(short_name(signal));
  text.add("): finishing ");
  if (const int64_t step = g_stop_step.load(); step > 0) {
    text.add("step ");
    text.add(step);
  } else {
    text.add("the current step");
  }
  const char* again = signal == SIGINT ? "press Ctrl-C again" : "send the signal again";
  if (g_checkpoint.load()) {
    text.add(", then writing a checkpoint; ");
    text.add(again);
    text.add(" to stop without one\n");
  } else {
    text.add(", then stopping (no checkpoint.dir: nothing is saved); ");
    text.add(again);
    text.add(" to stop at once\n");
  }
  text.write_to(STDERR_FILENO);
}

// Whether the file at g_remove_path still holds g_remove_marker (open, read and close only: all
// async-signal-safe). A file that cannot be read is left alone.
bool registered_file_still_ours() {
  const size_t marker = std::strlen(g_remove_marker);
  if (marker == 0) return true;
  const int fd = ::open(g_remove_path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  char text[8192];
  size_t size = 0;
  for (ssize_t n; size < sizeof(text) && (n = ::read(fd, text + size, sizeof(text) - size)) > 0;) size += size_t(n);
  ::close(fd);
  for (size_t at = 0; at + marker <= size; ++at)
    if (std::memcmp(text + at, g_remove_marker, marker) == 0) return true;
  return false;
}

// A claim that another job took over (--force) is theirs now: it is removed only while it is ours.
void remove_registered_file() {
  if (g_remove_armed.exchange(false) && registered_file_still_ours()) ::unlink(g_remove_path);
}

// Dies of `signal` with its default action, after removing the registered file.
void die_of(int signal) {
  remove_registered_file();
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

extern "C" void on_stop_signal(int signal) {
  const int saved_errno = errno;
  const int64_t now = monotonic_ns();
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, signal)) {
    g_first_ns.store(now);
    if (g_acknowledge.load()) acknowledge(signal);
    errno = saved_errno;
    return;
  }
  if (now - g_first_ns.load() < kSameRequestNs) {  // the same request, delivered twice
    errno = saved_errno;
    return;
  }
  // A second request: stop now.
  if (g_acknowledge.load()) {
    Text text;
    text.add("second stop request: stopping now, without a checkpoint\n");
    text.write_to(STDERR_FILENO);
  }
  die_of(signal);
}

// SIGHUP (the terminal went away): nobody is left to answer, so stop at once.
extern "C" void on_hangup(int signal) { die_of(signal); }

// SIGABRT, SIGSEGV, SIGBUS: remove the file and die of the signal as before (SA_RESETHAND put the
// default action back; SA_NODEFER lets raise() deliver it at once, also when it was sent with kill).
extern "C" void on_fatal(int signal) {
  remove_registered_file();
  ::raise(signal);
}
}  // namespace

void StopSignal::install() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  struct sigaction previous {};
  if (sigaction(SIGHUP, nullptr, &previous) == 0 && previous.sa_handler != SIG_IGN) {  // nohup keeps ignoring it
    struct sigaction hangup {};
    hangup.sa_handler = on_hangup;
    sigemptyset(&hangup.sa_mask);
    sigaction(SIGHUP, &hangup, nullptr);
  }
  struct sigaction fatal {};
  fatal.sa_handler = on_fatal;
  fatal.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigemptyset(&fatal.sa_mask);
  for (int signal : {SIGABRT, SIGSEGV, SIGBUS}) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) sigaction(signal, &fatal, nullptr);
  }
}

bool StopSignal::requested() { return g_signal.load() != 0; }
int StopSignal::signal_number() { return g_signal.load(); }
void StopSignal::request(int signal) {
  g_first_ns.store(monotonic_ns());
  g_signal.store(signal);
}

void StopSignal::enable_acknowledgement(bool checkpoint) {
  g_checkpoint.store(checkpoint);
  if (g_acknowledge.exchange(true)) return;
  if (const int signal = g_signal.load()) acknowledge(signal);  // it came before anyone could say so
}

void StopSignal::set_stop_step(int64_t step) { g_stop_step.store(step); }

void StopSignal::remove_on_hard_stop(const std::string& path, const std::string& marker) {
  g_remove_armed.store(false);
  if (path.empty() || path.size() >= sizeof(g_remove_path) || marker.size() >= sizeof(g_remove_marker)) return;
  std::memcpy(g_remove_path, path.c_str(), path.size() + 1);
  std::memcpy(g_remove_marker, marker.c_str(), marker.size() + 1);
  g_remove_armed.store(true);
}

std::string signal_name(int signal) {
  const char* name = short_name(signal);
  return std::strcmp(name, "a signal") == 0 ? fmt::format("signal {}", signal) : name;
}

}  // namespace trainer::runtime
