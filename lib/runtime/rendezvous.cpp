#include "runtime/rendezvous.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <exception>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "runtime/stop_signal.h"

namespace trainer::runtime {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kFirstReport = std::chrono::seconds(2);  // a quick rendezvous prints nothing
constexpr auto kReportEvery = std::chrono::seconds(5);
constexpr auto kPoll = std::chrono::milliseconds(50);

// c10's messages carry a C++ stack trace (dozens of lines): keep the first line, which says what
// went wrong.
std::string first_line(const std::exception& e) {
  std::string reason = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) reason = c10_error->what_without_backtrace();
  if (const auto newline = reason.find('\n'); newline != std::string::npos) reason.resize(newline);
  while (!reason.empty() && (reason.back() == '.' || reason.back() == ' ')) reason.pop_back();
  return reason;
}

// "" when a TCP connection to host:port is accepted within `wait`, else why not. The connection is
// closed at once: it only tells that the store is being served.
std::string try_connect(const std::string& host, int port, std::chrono::milliseconds wait) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    return fmt::format("cannot resolve {}: {}", host, ::gai_strerror(rc));
  std::string reason = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      reason = std::strerror(errno);
      continue;
    }
    int error = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, int(wait.count()));
      socklen_t length = sizeof(error);
      if (ready == 1)
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      else
        error = ready == 0 ? ETIMEDOUT : errno;
    }
    ::close(fd);
    if (error == 0) {
      ::freeaddrinfo(found);
      return "";
    }
    reason = std::strerror(error);
  }
  ::freeaddrinfo(found);
  return reason;
}

double seconds(std::chrono::milliseconds duration) { return double(duration.count()) / 1000; }

// What a rank says when a stop signal ends its wait.
Interrupted stopped_while(const LaunchEnvironment& env, int signal, const std::string& state) {
  return Interrupted(signal, fmt::format("rank {}: stopped by {} while {}; nothing was started", env.rank,
                                         signal_name(signal), state));
}

class Wait {
 public:
  Wait(const LaunchEnvironment& env, std::chrono::milliseconds timeout)
      : env_(env), timeout_(timeout), start_(Clock::now()), next_report_(start_ + kFirstReport) {}

  bool expired() const { return Clock::now() >= start_ + timeout_; }
  std::chrono::milliseconds left() const {
    return std::max(std::chrono::milliseconds(1000),
                    std::chrono::duration_cast<std::chrono::milliseconds>(start_ + timeout_ - Clock::now()));
  }
  std::string where() const { return fmt::format("{}:{}", env_.master_addr, env_.master_port); }
  std::string progress() const {
    return fmt::format("waited {:.0f} of {:g} s (parallel.collective_timeout_s)",
                       std::chrono::duration<double>(Clock::now() - start_).count(), seconds(timeout_));
  }

  // Throws Interrupted on a stop signal; every few seconds the first rank of a node says `state()`.
  template <class State>
  void check(const State& state) {
    if (const int signal = StopSignal::signal_number()) throw stopped_while(env_, signal, state());
    if (Clock::now() < next_report_) return;
    next_report_ = Clock::now() + kReportEvery;
    if (env_.local_rank == 0) {
      std::fprintf(stderr, "rank %lld: %s; %s\n", (long long)env_.rank, state().c_str(), progress().c_str());
      std::fflush(stderr);
    }
  }

 private:
  const LaunchEnvironment& env_;
  std::chrono::milliseconds timeout_;
  Clock::time_point start_, next_report_;
};

std::atomic<bool> g_abandoned{false};

// The rendezvous did not happen in time: passed through unchanged.
class RendezvousFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

bool rendezvous_abandoned() { return g_abandoned.load(); }

c10::intrusive_ptr<c10d::Store> connect_rendezvous(const LaunchEnvironment& env, std::chrono::milliseconds timeout) {
  Wait wait(env, timeout);
  const bool serve = env.rank == 0 && !env.store_in_launcher;
  const std::string where = wait.where();
  auto fail = [&](const std::string& what) {
    return RendezvousFailed(fmt::format(
        "rank {}: no rendezvous at {} (address from {}) within {:g} s (parallel.collective_timeout_s): {}. Check that "
        "every node was started, MASTER_ADDR and MASTER_PORT, and that the port is free on node 0 and reachable "
        "from every node",
        env.rank, where, env.master_source, seconds(timeout), what));
  };

  // 1. Until node 0 serves the store (the other ranks).
  if (!serve) {
    std::string reason;
    auto state = [&] { return fmt::format("waiting for node 0 at {} (not reachable yet: {})", where, reason); };
    while (!(reason = try_connect(env.master_addr, env.master_port, std::chrono::milliseconds(500))).empty()) {
      if (wait.expired()) throw fail(fmt::format("node 0's store never became reachable ({})", reason));
      wait.check(state);
      // A refused connection returns at once: do not spin.
      for (int i = 0; i < 10 && !StopSignal::requested(); ++i) std::this_thread::sleep_for(kPoll);
    }
  }

  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = serve;
  options.waitWorkers = false;  // waited for below, where it can be interrupted
  options.timeout = wait.left();
  // c10d's constructor retries on its own, deaf to signals and past its timeout (a port where some
  // other service answers keeps it busy for minutes): it runs aside, and is left behind on a signal
  // or at the deadline.
  struct Pending {
    std::mutex mutex;
    bool done = false;
    c10::intrusive_ptr<c10d::Store> store;
    std::exception_ptr error;
  };
  auto pending = std::make_shared<Pending>();
  std::thread([pending, address = env.master_addr, options] {
    c10::intrusive_ptr<c10d::Store> store;
    std::exception_ptr error;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(address, options);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(pending->mutex);
    pending->store = store;
    pending->error = error;
    pending->done = true;
  }).detach();
  auto connecting = [&] {
    return fmt::format("connecting to the store at {} (the port accepts connections, but no store has answered yet)",
                       where);
  };
  c10::intrusive_ptr<c10d::Store> store;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(pending->mutex);
      if (pending->done) {
        if (pending->error) {
          try {
            std::rethrow_exception(pending->error);
          } catch (const std::exception& e) {
            throw fail(fmt::format("cannot {} the store: {}", serve ? "serve" : "reach", first_line(e)));
          }
        }
        store = pending->store;
        break;
      }
    }
    try {
      if (wait.expired())
        throw fail(fmt::format("the port accepts connections but no rendezvous store answered there (another "
                               "service on MASTER_PORT?)"));
      wait.check(connecting);
    } catch (...) {
      g_abandoned.store(true);  // the thread may still be inside c10d
      throw;
    }
    std::this_thread::sleep_for(kPoll);
  }
  store->setTimeout(timeout);

  // 2. Until every rank has joined. Ranks count themselves, and the first rank of each node counts
  // its node (nodes are known when every node runs the same number of ranks).
  const bool count_nodes = env.local_world_size > 0 && env.world_size % env.local_world_size == 0 &&
                           env.world_size > env.local_world_size;
  const int64_t nodes = count_nodes ? env.world_size / env.local_world_size : 0;
  const std::string ranks_key = "trainer/rendezvous/ranks", nodes_key = "trainer/rendezvous/nodes";
  int64_t ranks_present = 0, nodes_present = 0;
  auto present = [&] {
    const std::string ranks = fmt::format("{} of {} ranks", ranks_present, env.world_size);
    return count_nodes ? fmt::format("{} of {} nodes present, {}", nodes_present, nodes, ranks) : ranks + " present";
  };
  auto state = [&] { return fmt::format("waiting for the other ranks at {} ({})", where, present()); };
  try {
    if (count_nodes && env.local_rank == 0) store->add(nodes_key, 1);
    store->add(ranks_key, 1);
    // From 10 ms to 200 ms between reads: quick when everybody is there, light on the store when
    // thousands of ranks wait, and never more than 0.2 s late for a signal.
    auto pause = std::chrono::milliseconds(10);
    while (true) {
      ranks_present = store->add(ranks_key, 0);
      if (count_nodes) nodes_present = store->add(nodes_key, 0);
      if (ranks_present >= env.world_size) break;
      if (wait.expired()) throw fail(fmt::format("only {}", present()));
      wait.check(state);
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(200));
    }
  } catch (const Interrupted&) {
    throw;
  } catch (const RendezvousFailed&) {
    throw;
  } catch (const std::exception& e) {
    if (const int signal = StopSignal::signal_number()) throw stopped_while(env, signal, state());
    throw fail(fmt::format("the store failed ({}) with {}", first_line(e), present()));
  }
  return store;
}

}  // namespace trainer::runtime
