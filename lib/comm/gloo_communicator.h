#pragma once
// The CPU backend: c10d's ProcessGroupGloo (compiled into libtorch_cpu) over a prefix of the
// job's store. Reduce-scatter is an all-reduce followed by taking this rank's chunk (Gloo has no
// native one in c10d); fine for correctness, and CPU runs are for testing.
#include <c10/util/intrusive_ptr.h>

#include <memory>

#include "comm/communicator.h"

namespace c10d {
class Store;
}

namespace trainer::comm {

// Collective over `global_ranks` (this process must be one of them); `store_prefix` must be unique
// per group and the same on every member; `interface_address`: the local address Gloo binds
// ("127.0.0.1" for one node; "" picks the host's default interface).
std::unique_ptr<Communicator> make_gloo_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::string& store_prefix, std::string name,
                                                     std::vector<int64_t> global_ranks, int64_t global_rank,
                                                     std::shared_ptr<CommContext> context,
                                                     const std::string& interface_address);

}  // namespace trainer::comm
