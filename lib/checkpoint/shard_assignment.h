#pragma once
// Who writes what. A rank writes what only it holds (its ZeRO shards, later its tensor- and
// pipeline-parallel slices); data that is replicated over the data-parallel ranks is written once,
// spread over those ranks so that each writes about as much (all ranks write in parallel).
#include <cstdint>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace trainer::checkpoint {

// The data-parallel rank that writes each replicated item, given the items' sizes in bytes:
// largest first, each to the least loaded rank (the lowest on a tie). Every rank computes the
// same answer from the same sizes.
std::vector<int64_t> assign_replicated(const std::vector<uint64_t>& bytes, int64_t ranks);

// The records of `records` that data-parallel rank `dp_rank` of `dp_size` writes.
std::vector<TensorRecord> records_to_write(std::vector<TensorRecord> records, int64_t dp_rank, int64_t dp_size);

}  // namespace trainer::checkpoint
