#pragma once
// Before the first step: can checkpoints be written to checkpoint.dir at all? A path under a
// file, a read-only or full disk must fail at start (exit 2), not after hours of training.
#include <cstdint>
#include <string>

namespace trainer::checkpoint {

// Creates `dir` if needed, writes, fsyncs and removes a 4 KiB probe file named after `rank`, and
// checks that the file system has at least `bytes_needed` free (this rank's part of one
// checkpoint; 0 skips the check). Throws UserError naming checkpoint.dir, the reason and the fix.
void check_checkpoint_dir(const std::string& dir, int64_t rank, uint64_t bytes_needed);

}  // namespace trainer::checkpoint
