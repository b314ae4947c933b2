#pragma once
// Who writes what. A rank writes what only it holds (its ZeRO shards, its tensor- and
// pipeline-parallel slices); data replicated over a group of ranks (TensorRecord::replicated) is
// written once, spread over that group so that each rank writes about as much (all ranks write in
// parallel).
#include <cstdint>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace trainer::checkpoint {

// The position in a group of `ranks` that writes each replicated item, given the items' sizes in
// bytes: largest first, each to the least loaded rank (the lowest on a tie). Every rank computes
// the same answer from the same sizes.
std::vector<int64_t> assign_replicated(const std::vector<uint64_t>& bytes, int64_t ranks);

// The records this rank writes: those only it holds, and its share of each replication group's
// records (assigned per group name over the group's ranks, which all hold the same list).
std::vector<TensorRecord> records_to_write(std::vector<TensorRecord> records);

}  // namespace trainer::checkpoint
