#include "runtime/launch_policy.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace trainer::runtime {

namespace {

const char* read(const GetEnv& getenv, const char* name) { return getenv ? getenv(name) : std::getenv(name); }

}  // namespace

void check_launch_request(const LaunchRequest& request, const LaunchEnvironment& env, const GetEnv& getenv) {
  if (request.nnodes <= 1 && request.node_rank == 0) return;
  if (env.launcher != "none")
    throw UserError(fmt::format("--nnodes {} given, but the job was already started by a launcher ({}); drop "
                                "--nnodes and --node-rank",
                                request.nnodes, env.launcher));
  if (request.node_rank < 0 || request.node_rank >= request.nnodes)
    throw UserError(fmt::format("--node-rank {} is not a node of --nnodes {}; use 0 to {}", request.node_rank,
                                request.nnodes, request.nnodes - 1));
  if (!read(getenv, "MASTER_ADDR") || !read(getenv, "MASTER_PORT"))
    throw UserError(fmt::format("--nnodes {} needs MASTER_ADDR and MASTER_PORT in the environment of every "
                                "launch: node 0's address and a free port there, where its launcher serves the "
                                "rendezvous (as torchrun's --master-addr and --master-port)",
                                request.nnodes));
}

bool starts_local_workers(const LaunchRequest& request, const LaunchEnvironment& env) {
  return env.launcher == "none" && (request.nproc_per_node > 1 || request.nnodes > 1);
}

LocalLaunchOptions local_launch_options(const LaunchRequest& request, const GetEnv& getenv) {
  LocalLaunchOptions launch;
  launch.nproc = request.nproc_per_node;
  launch.nnodes = request.nnodes;
  launch.node_rank = request.node_rank;
  if (request.nnodes > 1) {
    // Read here: without a launcher's variables detect_launch_environment does not look at them.
    launch.master_addr = read(getenv, "MASTER_ADDR");
    const std::string port = read(getenv, "MASTER_PORT");
    char* end = nullptr;
    const long value = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || value < 1 || value > 65535)
      throw UserError(fmt::format("MASTER_PORT={} is not a TCP port (1-65535)", port));
    launch.master_port = int(value);
  }
  return launch;
}

void check_no_local_launch_under_launcher(const LaunchRequest& request, const LaunchEnvironment& env) {
  if (env.launcher != "none" && request.nproc_per_node > 1)
    throw UserError(fmt::format("--nproc-per-node {} given, but the job was already started by a launcher ({}, "
                                "world size {}); drop --nproc-per-node",
                                request.nproc_per_node, env.launcher, env.world_size));
}

}  // namespace trainer::runtime
