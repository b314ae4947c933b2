#include "checkpoint/dir_claim.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/json_file.h"

namespace trainer::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kClaimFile = ".claim.json";
constexpr off_t kMaxClaimBytes = 64 * 1024;  // ours are a few hundred bytes

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// Fields 3 (state) to 22 (start time) of /proc/PID/stat; empty when it cannot be read.
std::vector<std::string> process_stat(int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  // The whole file, not a line: the command name may hold spaces, ')' and even a newline.
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 > text.size()) return {};
  std::istringstream stream(text.substr(close + 2));
  std::vector<std::string> fields;
  for (std::string field; fields.size() < 20 && (stream >> field);) fields.push_back(field);
  return fields.size() == 20 ? fields : std::vector<std::string>{};
}

// The kernel's start time of a process (field 22 of /proc/PID/stat, in clock ticks since boot):
// with the pid it identifies the process even after the pid is reused. "" when it cannot be read.
std::string process_start(int64_t pid) {
  const auto fields = process_stat(pid);
  return fields.empty() ? "" : fields[19];
}

// Whether the process has exited: gone, or a zombie (state Z or X) that its parent has not reaped
// yet (kill(pid, 0) still succeeds for those).
bool process_exited(int64_t pid) {
  const auto fields = process_stat(pid);
  return !fields.empty() && (fields[0] == "Z" || fields[0] == "X");
}

std::string utc_time(double seconds) {
  const std::time_t t = std::time_t(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string random_token() {
  std::random_device device;
  return fmt::format("{:016x}{:08x}", (uint64_t(device()) << 32) | device(), uint32_t(::getpid()));
}

// The fields of a claim that have the expected type and range; others are dropped (a claim file is
// read from a shared directory: it may be damaged, or written by anyone).
nlohmann::json well_typed(const nlohmann::json& claim) {
  nlohmann::json out = nlohmann::json::object();
  if (!claim.is_object()) return out;
  for (const char* name : {"host", "process_start", "job", "job_key", "token"})
    if (claim.contains(name) && claim[name].is_string()) out[name] = claim[name];
  for (const char* name : {"started", "heartbeat"})  // seconds since 1970, before year 10000
    if (claim.contains(name) && claim[name].is_number() && claim[name].get<double>() >= 0 &&
        claim[name].get<double>() < 2.5e11)
      out[name] = claim[name].get<double>();
  if (claim.contains("pid") && claim["pid"].is_number_integer() && claim["pid"].get<int64_t>() > 0 &&
      claim["pid"].get<int64_t>() <= (int64_t(1) << 30))  // kill(-1, 0) must never be asked
    out["pid"] = claim["pid"];
  return out;
}

ClaimStatus assess(const nlohmann::json& claim) {
  ClaimStatus status;
  status.claim = claim;
  const double age = now_seconds() - claim.value("heartbeat", 0.0);
  const std::string host = claim.value("host", "");
  const int64_t pid = claim.value("pid", int64_t(0));
  if (host == host_name() && pid > 0) {
    const bool exists = ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
    if (!exists || process_start(pid) != claim.value("process_start", "")) {
      status.why = fmt::format("its process {} no longer exists on {}", pid, host);
      return status;
    }
    if (process_exited(pid)) {
      status.why = fmt::format("its process {} on {} has exited (a zombie its parent has not reaped yet)", pid, host);
      return status;
    }
  }
  if (age > kStaleSeconds) {
    status.why = fmt::format("its heartbeat is {:.0f} s old, stale after {:.0f} s", age, kStaleSeconds);
    return status;
  }
  status.live = true;
  status.why = fmt::format("heartbeat {:.0f} s ago", std::max(0.0, age));
  return status;
}

// Writes `content` to a new unique file next to `path` and returns its name.
std::string write_temporary(const std::string& path, const nlohmann::json& content) {
  const std::string temporary = fmt::format("{}.{}.tmp", path, random_token());
  std::ofstream out(temporary, std::ios::trunc);
  out << content.dump(2) << "\n";
  out.close();
  if (!out) throw UserError(fmt::format("{}: cannot write the checkpoint directory's claim file", temporary));
  return temporary;
}

std::string refused(const std::string& dir, const ClaimStatus& status) {
  return fmt::format("checkpoint.dir {} is in use by {} ({}); stop that job first, use another checkpoint.dir, or "
                     "pass --force to take the directory over",
                     dir, status.describe(), status.why);
}

}  // namespace

std::string ClaimStatus::describe() const {
  const std::string job = claim.value("job", "");
  return fmt::format("{}(pid {} on {}) since {}", job.empty() ? "a job " : job + " ", claim.value("pid", int64_t(0)),
                     claim.value("host", std::string("?")), utc_time(claim.value("started", 0.0)));
}

std::optional<ClaimStatus> read_claim(const std::string& dir) {
  const std::string path = (fs::path(dir) / kClaimFile).string();
  // Only a small regular file is read (a FIFO or a device in its place would block or never end);
  // anything else reads as a malformed claim, which is not live.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  std::string text;
  struct stat info {};
  if (fd >= 0 && ::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size <= kMaxClaimBytes) {
    text.resize(size_t(info.st_size));
    const ssize_t got = ::read(fd, text.data(), text.size());
    text.resize(got > 0 ? size_t(got) : 0);
  }
  if (fd >= 0) ::close(fd);
  nlohmann::json claim = nlohmann::json::object();
  try {
    check_json_depth(text, path);
    claim = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    claim = nlohmann::json::object();  // half-written by a dead holder: no heartbeat, so not live
  }
  return assess(well_typed(claim));
}

void DirClaim::check_not_claimed_by_other(const std::string& dir, const ClaimIdentity& me) {
  const auto status = read_claim(dir);
  if (!status || !status->live) return;
  if (!me.job_key.empty() && status->claim.value("job_key", "") == me.job_key) return;  // our own rank 0
  throw UserError(refused(dir, *status));
}

std::unique_ptr<DirClaim> DirClaim::acquire(const std::string& dir, const ClaimIdentity& me, bool force) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error)
    throw UserError(fmt::format("checkpoint.dir {}: cannot be created ({}); choose a directory this job can write",
                                dir, error.message()));
  const std::string path = (fs::path(dir) / kClaimFile).string();
  const double started = now_seconds();
  nlohmann::json claim = {{"host", host_name()},   {"pid", int64_t(::getpid())},
                          {"process_start", process_start(::getpid())},
                          {"job", me.job},         {"job_key", me.job_key},
                          {"started", started},    {"heartbeat", started},
                          {"token", random_token()}};
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string temporary = write_temporary(path, claim);
    const bool linked = ::link(temporary.c_str(), path.c_str()) == 0;
    const int link_errno = errno;
    ::unlink(temporary.c_str());
    if (linked) return std::unique_ptr<DirClaim>(new DirClaim(dir, claim));
    if (link_errno != EEXIST)
      throw UserError(fmt::format("checkpoint.dir {}: cannot create the claim file {} ({})", dir, path,
                                  std::strerror(link_errno)));
    const auto holder = read_claim(dir);
    if (!holder) continue;  // released meanwhile: try again
    if (holder->live && !force) throw UserError(refused(dir, *holder));
    std::fprintf(stderr, "warning: checkpoint.dir %s: taking over the claim of %s (%s)%s\n", dir.c_str(),
                 holder->describe().c_str(), holder->why.c_str(), holder->live ? ", as --force asks" : "");
    // Remove the old claim only if it is still the one just judged, then race for a fresh link().
    const auto again = read_claim(dir);
    if (again && again->claim == holder->claim && ::unlink(path.c_str()) != 0 && errno != ENOENT)
      throw UserError(fmt::format("checkpoint.dir {}: cannot remove the dead claim {} ({}); remove it by hand", dir,
                                  path, std::strerror(errno)));
  }
  throw UserError(fmt::format("checkpoint.dir {}: could not claim it (another job keeps claiming it at the same time)",
                              dir));
}

DirClaim::DirClaim(std::string dir, nlohmann::json claim)
    : dir_(std::move(dir)),
      path_((fs::path(dir_) / kClaimFile).string()),
      claim_(std::move(claim)),
      token_(claim_.value("token", "")) {
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

DirClaim::~DirClaim() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  const auto status = read_claim(dir_);
  if (status && status->claim.value("token", "") == claim_.value("token", "")) ::unlink(path_.c_str());
}

std::string DirClaim::lost_to() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lost_to_;
}

void DirClaim::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::duration<double>(kHeartbeatSeconds), [this] { return stopping_; });
    if (stopping_) break;
    // Ours still? Another job that took the directory over means this one must stop.
    const auto status = read_claim(dir_);
    if (!status || status->claim.value("token", "") != claim_.value("token", "")) {
      lost_to_ = status ? status->describe() : "nobody (the claim file was removed)";
      lost_.store(true);
      break;
    }
    claim_["heartbeat"] = now_seconds();
    try {
      const std::string temporary = write_temporary(path_, claim_);
      if (::rename(temporary.c_str(), path_.c_str()) != 0) ::unlink(temporary.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: %s\n", e.what());  // a full disk: the next beat tries again
    }
  }
}

}  // namespace trainer::checkpoint
