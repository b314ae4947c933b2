#include "runtime/local_launcher.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "core/file_tree.h"

namespace trainer::runtime {

namespace {

std::atomic<int> g_forward_signal{0};
extern "C" void remember_signal(int signal) { g_forward_signal.store(signal); }

}  // namespace

namespace {
ListeningSocket listen_at(uint32_t host, int port, const std::string& where) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  if (fd >= 0 && port != 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(host);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    // A port the user chose (MASTER_PORT) that is taken is theirs to change; a free port that cannot
    // be had is this host's problem.
    if (port != 0)
      throw UserError(fmt::format("cannot listen on {}: {}; choose a free port for MASTER_PORT (the same on every "
                                  "node), or stop the process that holds it",
                                  where, std::strerror(error)));
    throw std::runtime_error(fmt::format("cannot listen on {}: {}", where, std::strerror(error)));
  }
  return {fd, ntohs(address.sin_port)};
}
}  // namespace

ListeningSocket listen_on_free_port() { return listen_at(INADDR_LOOPBACK, 0, "a free TCP port on 127.0.0.1"); }

ListeningSocket listen_on_port(int port) {
  return listen_at(INADDR_ANY, port, fmt::format("TCP port {} (MASTER_PORT) of this host", port));
}

namespace {

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// How one start of the workers ended.
struct Attempt {
  int code = 0;             // 0, the first failure's exit code (128 + signal), or 128 + a forwarded signal
  bool interrupted = false;  // ended by a stop signal this launcher passed on
  std::string cause;        // the first failure, described
};

// One start of the workers with `env` added to their environment: forks them, serves the
// rendezvous store on a fresh socket, waits, and on the first failure stops the others and reads
// the failing worker's message from `failure_dir` ("": none).
Attempt run_workers(const LocalLaunchOptions& options, const std::vector<std::pair<std::string, std::string>>& env,
                    const std::string& failure_dir) {
  // The launcher serves the rendezvous store on a socket it opened itself: no other process can take
  // the port between choosing and serving it, and a worker that stops (SIGSTOP, a hang) cannot
  // take the store down with it, so the others can still exchange their flight records. A restart
  // gets a fresh store (the previous start's keys would confuse the new rendezvous).
  const bool multi_node = options.nnodes > 1;
  const bool serves_store = options.node_rank == 0;
  ListeningSocket store_socket;
  if (serves_store) store_socket = multi_node ? listen_on_port(options.master_port) : listen_on_free_port();
  const int port = multi_node ? options.master_port : store_socket.port;
  const std::string master = multi_node ? options.master_addr : "127.0.0.1";
  const int world = options.nnodes * options.nproc, first_rank = options.node_rank * options.nproc;
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids(options.nproc, -1);

  for (int local = 0; local < options.nproc; ++local) {
    const int rank = first_rank + local;
    const pid_t pid = ::fork();
    if (pid < 0)
      throw std::runtime_error(fmt::format("cannot start worker rank {}: fork failed ({})", rank, std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(1);  // the launcher died before prctl
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", master.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("TRAINER_LAUNCHER_PID", std::to_string(launcher).c_str(), 1);
      ::setenv("TRAINER_STORE_IN_LAUNCHER", "1", 1);
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      // argv[0] is what ps shows: "trainer worker rank N run RECIPE ...".
      const std::string self = "/proc/self/exe", title = fmt::format("trainer worker rank {}", rank);
      std::vector<char*> args;
      args.push_back(const_cast<char*>(title.c_str()));
      for (size_t i = 1; i < options.argv.size(); ++i) args.push_back(const_cast<char*>(options.argv[i].c_str()));
      args.push_back(nullptr);
      ::execv(self.c_str(), args.data());
      std::fprintf(stderr, "worker %d: cannot start %s\n", rank, self.c_str());
      ::_exit(127);
    }
    pids[local] = pid;
  }

  // After the forks (a store thread during fork could hold a lock the children need). Workers that
  // connect before it serves wait in the socket's backlog.
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(port);
  store_options.isServer = true;
  store_options.waitWorkers = false;
  store_options.masterListenFd = store_socket.fd;
  // The store's own client connects over loopback (the socket listens on every address): a
  // MASTER_ADDR that does not lead back to this host then shows in the workers' wait, which says so
  // and can be interrupted, instead of stalling the launcher in c10d's connect loop.
  const auto store = serves_store ? c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options)
                                  : c10::intrusive_ptr<c10d::TCPStore>();

  Attempt attempt;
  int running = options.nproc;
  bool stopping = false;
  int forwarded = 0;  // the stop signal this launcher received and passed on
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto signal_all = [&](int signal) {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, signal);
  };
  // Marks the worker of `pid` as exited; its rank, or -1 for another child.
  auto reap = [&](pid_t pid) {
    for (int local = 0; local < options.nproc; ++local)
      if (pids[local] == pid) {
        pids[local] = -1;
        --running;
        return first_rank + local;
      }
    return -1;
  };
  while (running > 0) {
    if (const int signal = g_forward_signal.exchange(0)) {  // SIGINT/SIGTERM reach every worker
      forwarded = signal;
      signal_all(signal);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      const int rank = reap(pid);
      if (rank < 0) continue;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      // A worker that stopped because of the signal passed on to it did what was asked: the others
      // got the same signal and stop on their own; the launcher exits with its code (130, 143).
      if (forwarded != 0 && code == 128 + forwarded) {
        if (attempt.code == 0) attempt.code = code;
        attempt.interrupted = true;
        continue;
      }
      if (code != 0 && !stopping) {
        // Workers that exited in the same moment: one killed by a signal is the cause, the others
        // only lost their peer.
        int cause_rank = rank, cause_status = status;
        for (pid_t other; (other = ::waitpid(-1, &status, WNOHANG)) > 0;) {
          const int other_rank = reap(other);
          if (other_rank >= 0 && WIFSIGNALED(status) && !WIFSIGNALED(cause_status))
            cause_rank = other_rank, cause_status = status;
        }
        const int cause_code = WIFEXITED(cause_status) ? WEXITSTATUS(cause_status) : 128 + WTERMSIG(cause_status);
        std::fprintf(stderr, "trainer: worker rank %d %s%s\n", cause_rank,
                     WIFEXITED(cause_status) ? fmt::format("exited with code {}", cause_code).c_str()
                                             : fmt::format("was killed by signal {}", WTERMSIG(cause_status)).c_str(),
                     running > 0 ? fmt::format("; stopping the other {} worker(s)", running).c_str() : "");
        attempt.code = cause_code;
        attempt.cause = describe_worker_failure(
            cause_rank, cause_status,
            failure_dir.empty() ? "" : read_text(fmt::format("{}/rank-{}.txt", failure_dir, cause_rank)));
        // SIGHUP, not SIGTERM: a graceful stop (finish the step, checkpoint) needs the peer that is
        // gone, so the others would wait in their collective until the SIGKILL. SIGHUP ends a worker
        // at once and removes its claim on the checkpoint directory (runtime/stop_signal.h).
        stopping = true;
        signal_all(SIGHUP);
        signal_all(SIGCONT);  // a stopped worker (SIGSTOP) only acts on the SIGHUP once it continues
        stop_deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options.grace_seconds * 1000));
      }
      continue;
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      signal_all(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (forwarded != 0) attempt.interrupted = true;
  return attempt;
}

// A private directory for the workers' failure messages, removed with the object.
class FailureDir {
 public:
  FailureDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/trainer-failures-XXXXXX";
    if (::mkdtemp(pattern.data())) path_ = pattern;  // without it, causes come from exit statuses alone
  }
  ~FailureDir() {
    try {
      if (!path_.empty()) remove_tree(path_);
    } catch (const std::exception&) {  // a leftover temporary directory is no reason to fail
    }
  }
  FailureDir(const FailureDir&) = delete;
  FailureDir& operator=(const FailureDir&) = delete;
  const std::string& path() const { return path_; }
  // Empties it for the next start (the workers write rank-R.txt files only).
  void clear() const {
    if (path_.empty()) return;
    DIR* dir = ::opendir(path_.c_str());
    if (!dir) return;
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") ::unlink((path_ + "/" + name).c_str());
    }
    ::closedir(dir);
  }

 private:
  std::string path_;
};

}  // namespace

std::string describe_worker_failure(int rank, int status, const std::string& message) {
  if (WIFSIGNALED(status)) return fmt::format("worker rank {} was killed by signal {}", rank, WTERMSIG(status));
  std::string text = fmt::format("worker rank {} exited with code {}", rank, WEXITSTATUS(status));
  std::istringstream lines(message);
  std::string line, first, recorder, never;
  while (std::getline(lines, line)) {
    if (line.rfind("exit ", 0) == 0 && first.empty() && recorder.empty()) continue;  // the record's status line
    if (first.empty() && !trim(line).empty()) first = trim(line);
    if (recorder.empty() && line.find("flight recorder:") != std::string::npos)
      recorder = trim(line.substr(line.find("flight recorder:") + 16));
    if (never.empty() && line.find("never entered it") != std::string::npos) never = trim(line);
  }
  if (!never.empty()) {
    // "all_reduce #57 on group dp (ranks [0, 1, 2]) at step 12 did not complete. Entered: ..."
    const auto end = recorder.find(" did not complete");
    return fmt::format("{}: hang: {}: {}", text, recorder.substr(0, end), never);
  }
  if (!first.empty()) text += ": " + first;
  return text;
}

int launch_local_workers(const LocalLaunchOptions& options) {
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  const FailureDir failures;
  const long long since = (long long)unix_seconds();
  std::vector<std::pair<std::string, std::string>> env;
  if (!failures.path().empty()) env.emplace_back("TRAINER_FAILURE_DIR", failures.path());
  std::string cause;
  for (int restart = 0;; ++restart) {
    if (restart > 0) {
      env.emplace_back("TRAINER_RESTART", std::to_string(restart));
      env.emplace_back("TRAINER_RESTART_CAUSE", cause);
      env.emplace_back("TRAINER_RESTART_SINCE", std::to_string(since));
    }
    failures.clear();
    const Attempt attempt = run_workers(options, env, failures.path());
    if (restart > 0) env.resize(env.size() - 3);
    if (attempt.code == 0) {
      if (restart > 0) std::fprintf(stderr, "trainer: finished after %d restart%s\n", restart, restart == 1 ? "" : "s");
      return 0;
    }
    if (attempt.interrupted || options.max_restarts == 0) return attempt.code;
    cause = attempt.cause;
    if (attempt.code == 2 || attempt.code == 3) {
      std::fprintf(stderr, "trainer: not restarting: %s would only repeat (%s)\n",
                   attempt.code == 2 ? "bad input (exit 2)" : "a diverged run (exit 3)", cause.c_str());
      return attempt.code;
    }
    if (restart == options.max_restarts) {
      std::fprintf(stderr, "trainer: giving up after %d restart%s; last cause: %s\n", restart,
                   restart == 1 ? "" : "s", cause.c_str());
      return 1;
    }
    if (const int signal = g_forward_signal.exchange(0)) return 128 + signal;  // asked to stop meanwhile
    std::fprintf(stderr, "trainer: restart %d of %d after %s\n", restart + 1, options.max_restarts, cause.c_str());
  }
}

}  // namespace trainer::runtime
