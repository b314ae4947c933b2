#pragma once
// The job's rendezvous: libtorch's c10d TCPStore at MASTER_ADDR:MASTER_PORT, served by rank 0, or under
// trainer's own launcher by the launcher (LaunchEnvironment::store_in_launcher).
#include <c10/util/intrusive_ptr.h>

#include <chrono>

#include "runtime/launch_env.h"

namespace c10d {
class Store;
}

namespace trainer::runtime {

// Connects (rank 0 also serves) and waits until every rank has joined. Throws std::runtime_error
// naming the address, the port and the timeout when that does not happen in time.
c10::intrusive_ptr<c10d::Store> connect_rendezvous(const LaunchEnvironment& env, std::chrono::seconds timeout);

}  // namespace trainer::runtime
