#pragma once
// The job's rendezvous: libtorch's c10d TCPStore at MASTER_ADDR:MASTER_PORT, served by rank 0, or under
// trainer's own launcher by the launcher (LaunchEnvironment::store_in_launcher).
//
// The wait is ours, not c10d's, so that it can be watched and interrupted: a rank first waits for
// the store's port to accept connections ("waiting for node 0 at ADDR:PORT ..."), then for every
// rank to have joined ("... (1 of 2 nodes present, 4 of 8 ranks)"). The first rank of each node
// prints where it stands every few seconds; SIGINT or SIGTERM (runtime::StopSignal) ends the wait
// at once.
#include <c10/util/intrusive_ptr.h>

#include <chrono>

#include "runtime/launch_env.h"

namespace c10d {
class Store;
}

namespace trainer::runtime {

// Connects (rank 0 also serves) and waits until every rank has joined, at most `timeout` in all.
// Throws std::runtime_error naming the address, the port, the timeout and how many ranks had joined
// when that does not happen in time, and Interrupted when a stop signal arrives meanwhile.
c10::intrusive_ptr<c10d::Store> connect_rendezvous(const LaunchEnvironment& env, std::chrono::milliseconds timeout);

// Whether a rendezvous gave up on c10d's store constructor while it was still running (on a signal or
// at the deadline). The process must then end with std::_Exit, after flushing its output: static
// destructors would run under that thread's feet.
bool rendezvous_abandoned();

}  // namespace trainer::runtime
