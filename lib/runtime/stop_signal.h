#pragma once
// SIGINT and SIGTERM ask the training loop to stop after the current step (and checkpoint when
// configured). A second signal ends the process at once with the default action; one that comes
// within a second of the first is the same request delivered twice (a terminal signals the whole
// process group, and the launcher forwards the signal too) and is ignored.
namespace trainer::runtime {

class StopSignal {
 public:
  // Installs the handlers (process-wide; call once, from the app).
  static void install();
  // Whether a stop was requested, and by which signal (0: none).
  static bool requested();
  static int signal_number();
  // For tests: behave as if `signal` had arrived.
  static void request(int signal);
};

}  // namespace trainer::runtime
