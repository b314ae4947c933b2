#include "runtime/rendezvous.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>

namespace trainer::runtime {

c10::intrusive_ptr<c10d::Store> connect_rendezvous(const LaunchEnvironment& env, std::chrono::seconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.store_in_launcher;
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    // c10's message carries a C++ stack trace (dozens of lines): keep its first line, which says
    // what timed out and how many ranks had joined.
    std::string reason = e.what();
    if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) reason = c10_error->what_without_backtrace();
    if (const auto newline = reason.find('\n'); newline != std::string::npos) reason.resize(newline);
    while (!reason.empty() && (reason.back() == '.' || reason.back() == ' ')) reason.pop_back();
    throw std::runtime_error(fmt::format(
        "rank {}: cannot {} the rendezvous store at {}:{} (address from {}) within {} s: {}. Check MASTER_ADDR and "
        "MASTER_PORT, that rank 0 is running, and that the port is free and reachable",
        env.rank, options.isServer ? "serve" : "reach", env.master_addr, env.master_port, env.master_source,
        timeout.count(), reason));
  }
}

}  // namespace trainer::runtime
