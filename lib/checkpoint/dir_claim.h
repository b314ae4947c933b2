#pragma once
// One job per checkpoint directory. Rank 0 of a job claims checkpoint.dir before anything starts:
// DIR/.claim.json names the host, process, job, start time and a heartbeat the job refreshes every
// kHeartbeatSeconds. A second job that finds a live claim is refused (UserError, exit 2) naming
// the holder; a dead holder's claim is taken over with a warning, so a SIGKILLed job never locks
// its directory for good.
//
// Live means: on this host, the holder process still exists (pid and its start time, so a reused
// pid does not count) and its heartbeat is fresh; on another host, the heartbeat is younger than
// kStaleSeconds. Only link(), rename() and unlink() of whole files are used (no flock, which NFS
// and Lustre do not honour reliably): the claim file is created with link(), which fails when it
// exists, on local and network file systems alike. Two jobs taking over the same dead claim at the
// same moment can both believe they won; the heartbeat re-reads the claim each time, and a job
// that finds another job's claim in its place stops (lost()).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

namespace trainer::checkpoint {

constexpr double kHeartbeatSeconds = 10;
constexpr double kStaleSeconds = 60;  // a heartbeat older than this is a dead holder

// Who is asking: this process and the job it belongs to.
struct ClaimIdentity {
  std::string job;      // "slurm job 1234", "mpirun job ...", "" for a standalone run
  std::string job_key;  // the same for every rank of one job (rendezvous address and world size)
};

// What a claim file says, and how it looks from here.
struct ClaimStatus {
  nlohmann::json claim;  // the file's content
  bool live = false;
  std::string why;       // "pid 4567 no longer exists on node07", "heartbeat 75 s old", ...
  std::string describe() const;  // "job 123 (pid 4567 on node07) since 2026-11-23 10:02:11 UTC"
};

// The claim in `dir`, if any (a malformed file reads as a dead claim).
std::optional<ClaimStatus> read_claim(const std::string& dir);

class DirClaim {
 public:
  // Rank 0: claims `dir` (created if needed) for this job, taking over a dead holder's claim with a
  // warning on stderr, or a live one when `force`. Throws UserError when another job's claim is live.
  // Starts the heartbeat thread.
  static std::unique_ptr<DirClaim> acquire(const std::string& dir, const ClaimIdentity& me, bool force);
  // Other ranks, and a launcher before it starts workers: throws UserError when `dir` holds a live
  // claim of another job (one whose job_key differs from `me.job_key`; an empty key matches none).
  static void check_not_claimed_by_other(const std::string& dir, const ClaimIdentity& me);

  ~DirClaim();  // stops the heartbeat and removes the claim (if it is still ours)
  DirClaim(const DirClaim&) = delete;
  DirClaim& operator=(const DirClaim&) = delete;

  // True once the heartbeat found another job's claim in place of ours: training must stop.
  bool lost() const { return lost_.load(); }
  std::string lost_to() const;
  // The claim file (DIR/.claim.json), and the random token that only this job's claim holds.
  const std::string& path() const { return path_; }
  const std::string& token() const { return token_; }

 private:
  DirClaim(std::string dir, nlohmann::json claim);
  void heartbeat_loop();

  std::string dir_, path_;
  nlohmann::json claim_;
  const std::string token_;
  std::atomic<bool> lost_{false};
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string lost_to_;
  std::thread heartbeat_;
};

}  // namespace trainer::checkpoint
