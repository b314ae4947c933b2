#include "runtime/launch_env.h"

#include <fmt/format.h>

#include <cstdlib>

#include "core/error.h"

namespace trainer::runtime {

namespace {

std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string current;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

constexpr size_t kMaxHosts = 1 << 20;

void expand_one(const std::string& name, const std::string& whole, std::vector<std::string>& out) {
  const auto open = name.find('[');
  if (open == std::string::npos) {
    if (name.find(']') != std::string::npos) throw UserError(fmt::format("hostlist \"{}\": unmatched ']'", whole));
    out.push_back(name);
    return;
  }
  const auto close = name.find(']', open);
  if (close == std::string::npos) throw UserError(fmt::format("hostlist \"{}\": unmatched '['", whole));
  const std::string prefix = name.substr(0, open), suffix = name.substr(close + 1);
  const std::string inside = name.substr(open + 1, close - open - 1);
  size_t start = 0;
  while (start <= inside.size()) {
    const auto comma = inside.find(',', start);
    const std::string range = inside.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto dash = range.find('-');
    const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    if (lo.empty() || hi.empty() || lo.size() > 9 || hi.size() > 9 ||  // std::stol must not overflow
        lo.find_first_not_of("0123456789") != std::string::npos ||
        hi.find_first_not_of("0123456789") != std::string::npos)
      throw UserError(fmt::format("hostlist \"{}\": bad range \"{}\"", whole, range));
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a || b - a > 100000) throw UserError(fmt::format("hostlist \"{}\": bad range \"{}\"", whole, range));
    for (long i = a; i <= b; ++i) {
      // Several groups multiply ("a[1-99999]b[1-99999]"): no job has this many hosts.
      if (out.size() >= kMaxHosts)
        throw UserError(fmt::format("hostlist \"{}\" names more than {} hosts", whole, kMaxHosts));
      expand_one(prefix + fmt::format("{:0{}}", i, lo.size()) + suffix, whole, out);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

int64_t parse_int(const GetEnv& env, const char* name) {
  const char* v = env(name);
  char* end = nullptr;
  const long long value = std::strtoll(v, &end, 10);
  if (!*v || *end) throw UserError(fmt::format("environment variable {}=\"{}\" is not an integer", name, v));
  return value;
}

bool has(const GetEnv& env, const char* name) { return env(name) && *env(name); }

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  std::vector<std::string> out;
  for (const auto& part : split_top_level(hostlist)) expand_one(part, hostlist, out);
  return out;
}

LaunchEnvironment detect_launch_environment(const GetEnv& getenv_in) {
  const GetEnv env = getenv_in ? getenv_in : GetEnv([](const char* n) { return std::getenv(n); });
  // The launchers we know, in precedence order, and the variables each sets.
  struct Launcher {
    const char *name, *rank, *size, *local_rank, *local_size;
  };
  static const Launcher kLaunchers[] = {
      {"env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      // SLURM_TASKS_PER_NODE is "2" or "2(x3),1": its first number is the first node's count,
      // good enough to tell a one-node job (local == world) from a multi-node one.
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE"},
  };
  LaunchEnvironment e;
  const Launcher* found = nullptr;
  for (const auto& launcher : kLaunchers)
    if (has(env, launcher.rank) && has(env, launcher.size)) {
      found = &launcher;
      break;
    }
  // The job, for messages naming who holds a checkpoint directory.
  if (has(env, "SLURM_JOB_ID"))
    e.job = fmt::format("slurm job {}", env("SLURM_JOB_ID"));
  else if (has(env, "PMIX_NAMESPACE"))
    e.job = fmt::format("mpirun job {}", env("PMIX_NAMESPACE"));
  else if (has(env, "OMPI_MCA_ess_base_jobid"))
    e.job = fmt::format("mpirun job {}", env("OMPI_MCA_ess_base_jobid"));
  else if (has(env, "TRAINER_LAUNCHER_PID"))
    e.job = fmt::format("local job (launcher pid {})", env("TRAINER_LAUNCHER_PID"));
  if (has(env, "TRAINER_RESTART")) e.restart = parse_int(env, "TRAINER_RESTART");
  if (e.restart < 0) throw UserError(fmt::format("environment variable TRAINER_RESTART={} is negative", e.restart));
  if (has(env, "TRAINER_RESTART_CAUSE")) e.restart_cause = env("TRAINER_RESTART_CAUSE");
  if (has(env, "TRAINER_RESTART_SINCE")) e.restart_since = parse_int(env, "TRAINER_RESTART_SINCE");
  if (has(env, "TRAINER_FAILURE_DIR")) e.failure_dir = env("TRAINER_FAILURE_DIR");
  if (!found) return e;  // no launcher: a single process (or trainer's own --nproc-per-node)
  e.launcher = found->name;
  const std::string rank_var = found->rank, size_var = found->size;
  e.local_rank = has(env, found->local_rank) ? parse_int(env, found->local_rank) : 0;
  if (has(env, found->local_size))
    e.local_world_size = e.launcher == "slurm" ? std::atoll(env(found->local_size)) : parse_int(env, found->local_size);
  e.rank = parse_int(env, rank_var.c_str());
  e.world_size = parse_int(env, size_var.c_str());
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size)
    throw UserError(fmt::format("{}={} and {}={} are inconsistent: expected 0 <= rank < world size", rank_var,
                                e.rank, size_var, e.world_size));

  const char* nodelist = has(env, "SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST");
  if (nodelist && *nodelist) e.nodes = expand_hostlist(nodelist);
  if (has(env, "MASTER_ADDR")) {
    e.master_addr = env("MASTER_ADDR");
    e.master_source = "MASTER_ADDR";
  } else if (!e.nodes.empty()) {
    e.master_addr = e.nodes.front();
    e.master_source = "the first host of the Slurm node list";
  } else if (e.local_world_size < e.world_size) {
    throw UserError(fmt::format("a {}-rank job over several nodes ({} ranks on this one) needs MASTER_ADDR: the "
                                "address of rank 0's node (and optionally MASTER_PORT)",
                                e.world_size, e.local_world_size));
  }
  if (has(env, "MASTER_PORT")) {
    const int64_t port = parse_int(env, "MASTER_PORT");
    if (port < 1 || port > 65535) throw UserError(fmt::format("MASTER_PORT={} is not a TCP port", port));
    e.master_port = int(port);
  } else if (has(env, "SLURM_JOB_ID")) {
    // Jobs sharing a node should not share a port; below Linux's ephemeral range (32768 and up),
    // where outgoing connections take their ports.
    e.master_port = int(20000 + parse_int(env, "SLURM_JOB_ID") % 12000);
  }
  e.store_in_launcher = has(env, "TRAINER_STORE_IN_LAUNCHER") && std::string(env("TRAINER_STORE_IN_LAUNCHER")) == "1";
  return e;
}

}  // namespace trainer::runtime
