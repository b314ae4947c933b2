#pragma once
// Lets a host-memory backend (Gloo) carry CUDA tensors, for several ranks sharing one GPU
// (parallel.backend "gloo"): each operation copies its CUDA inputs into pinned host buffers once
// the work queued on the caller's current stream has produced them, runs the inner operation on
// the host buffers, and when wait() returns has queued the copies of the results back on the
// caller's current stream (so later work on that stream sees them, as Work promises). CPU tensors
// go to the inner communicator untouched. Correct, not fast: every operation synchronises the
// host with the stream once.
#include <memory>

#include "comm/communicator.h"

namespace trainer::comm {

std::unique_ptr<Communicator> stage_through_host(std::unique_ptr<Communicator> inner);

}  // namespace trainer::comm
