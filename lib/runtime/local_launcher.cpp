#include "runtime/local_launcher.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
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
#include <stdexcept>
#include <thread>

#include "core/error.h"

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

int launch_local_workers(const LocalLaunchOptions& options) {
  // The launcher serves the rendezvous store on a socket it opened itself: no other process can take
  // the port between choosing and serving it, and a worker that stops (SIGSTOP, a hang) cannot
  // take the store down with it, so the others can still exchange their flight records.
  const bool multi_node = options.nnodes > 1;
  const bool serves_store = options.node_rank == 0;
  ListeningSocket store_socket;
  if (serves_store) store_socket = multi_node ? listen_on_port(options.master_port) : listen_on_free_port();
  const int port = multi_node ? options.master_port : store_socket.port;
  const std::string master = multi_node ? options.master_addr : "127.0.0.1";
  const int world = options.nnodes * options.nproc, first_rank = options.node_rank * options.nproc;
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids(options.nproc, -1);
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

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

  int running = options.nproc, result = 0;
  bool stopping = false;
  int forwarded = 0;  // the stop signal this launcher received and passed on
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto signal_all = [&](int signal) {
    for (pid_t pid : pids)
      if (pid > 0) ::kill(pid, signal);
  };
  while (running > 0) {
    if (const int signal = g_forward_signal.exchange(0)) {  // SIGINT/SIGTERM reach every worker
      forwarded = signal;
      signal_all(signal);
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      int local = -1;
      for (int r = 0; r < options.nproc; ++r)
        if (pids[r] == pid) local = r;
      if (local < 0) continue;
      pids[local] = -1;
      const int rank = first_rank + local;
      --running;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      // A worker that stopped because of the signal passed on to it did what was asked: the others
      // got the same signal and stop on their own; the launcher exits with its code (130, 143).
      if (forwarded != 0 && code == 128 + forwarded) {
        if (result == 0) result = code;
        continue;
      }
      if (code != 0 && !stopping) {
        std::fprintf(stderr, "trainer: worker rank %d %s%s\n", rank,
                     WIFEXITED(status) ? fmt::format("exited with code {}", code).c_str()
                                       : fmt::format("was killed by signal {}", WTERMSIG(status)).c_str(),
                     running > 0 ? fmt::format("; stopping the other {} worker(s)", running).c_str() : "");
        result = code;
        stopping = true;
        signal_all(SIGTERM);
        signal_all(SIGCONT);  // a stopped worker (SIGSTOP) only acts on the SIGTERM once it continues
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
  return result;
}

}  // namespace trainer::runtime
