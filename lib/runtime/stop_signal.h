#pragma once
// SIGINT and SIGTERM ask the training loop to stop after the current step (and checkpoint when
// configured). A second signal ends the process at once with the default action; one that comes
// within a second of the first is the same request delivered twice (a terminal signals the whole
// process group, and the launcher forwards the signal too) and is ignored.
//
// The first signal is acknowledged at once on stderr (written from the handler, so it appears even
// in the middle of a long step) by the process that enable_acknowledgement() was called in (rank 0):
// "stop requested (SIGINT): finishing step 12, then writing a checkpoint; press Ctrl-C again to stop
// without one". A file registered with remove_on_hard_stop() (the checkpoint directory's claim) is
// unlinked (unless another job took it over) before the process dies on a second signal, SIGHUP, or
// a fatal signal (SIGABRT, SIGSEGV, SIGBUS): every exit that can still run code leaves no claim of
// its own behind.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace trainer::runtime {

class StopSignal {
 public:
  // Installs the handlers (process-wide; call once, from the app, before anything that should be
  // cleaned up on a hard stop is created).
  static void install();
  // Whether a stop was requested, and by which signal (0: none).
  static bool requested();
  static int signal_number();
  // For tests: behave as if `signal` had arrived.
  static void request(int signal);

  // From now on the first signal prints the acknowledgement (saying whether a checkpoint follows).
  // When a signal already came, the acknowledgement is printed now.
  static void enable_acknowledgement(bool checkpoint);
  // The step after which a stop requested now takes effect (named in the acknowledgement).
  static void set_stop_step(int64_t step);
  // A file to unlink when the process dies of a signal, only if it still contains `marker` (a claim
  // that another job has taken over in the meantime is left to it); "" forgets it. Not thread-safe
  // against itself: call from one thread.
  static void remove_on_hard_stop(const std::string& path, const std::string& marker = "");
};

// A wait (the rendezvous) that a stop signal ended: the process should exit at once with
// 128 + signal, after printing what(). Carries the signal.
class Interrupted : public std::runtime_error {
 public:
  Interrupted(int signal, const std::string& what) : std::runtime_error(what), signal_(signal) {}
  int signal() const { return signal_; }
  int exit_code() const { return 128 + signal_; }

 private:
  int signal_;
};

// "SIGINT", "SIGTERM", or "signal N".
std::string signal_name(int signal);

}  // namespace trainer::runtime
