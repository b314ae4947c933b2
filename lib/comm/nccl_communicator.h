#pragma once
// The GPU backend: raw NCCL calls on a dedicated communication stream. Each operation waits (on
// the GPU) for the work already queued on the compute stream, runs on the communication stream,
// and its Work::wait() makes the compute stream wait for it: ordering by CUDA events, no host
// synchronisation, so communication overlaps compute. A watchdog thread aborts the job when an
// operation does not complete within the timeout, naming the operation, the group and the step.
// The NCCL unique id travels through the job's store. Compiles without a GPU; needs one to run.
#include <c10/util/intrusive_ptr.h>

#include <memory>

#include "comm/communicator.h"

namespace c10d {
class Store;
}

namespace trainer::comm {

std::unique_ptr<Communicator> make_nccl_communicator(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::string& store_prefix, std::string name,
                                                     std::vector<int64_t> global_ranks, int64_t global_rank,
                                                     std::shared_ptr<CommContext> context, int device_index);

}  // namespace trainer::comm
