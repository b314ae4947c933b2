// `trainer run`'s launch rules: when it starts workers itself, and which command lines it refuses
// before anything starts.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "core/error.h"
#include "runtime/launch_policy.h"

using namespace trainer::runtime;

namespace {

GetEnv environment(std::map<std::string, std::string> values) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(values));
  return [shared](const char* name) -> const char* {
    const auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const trainer::UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("launch policy: the local launcher starts workers only without a launcher", "[runtime][launch]") {
  LaunchEnvironment standalone, srun;
  srun.launcher = "slurm";
  CHECK(starts_local_workers({4, 1, 0}, standalone));
  CHECK(starts_local_workers({1, 2, 1}, standalone));
  CHECK_FALSE(starts_local_workers({1, 1, 0}, standalone));
  CHECK_FALSE(starts_local_workers({4, 1, 0}, srun));
  CHECK_THAT(refusal([&] { check_no_local_launch_under_launcher({4, 1, 0}, srun); }),
             Catch::Contains("--nproc-per-node 4 given, but the job was already started by a launcher (slurm"));
  CHECK(refusal([&] { check_no_local_launch_under_launcher({1, 1, 0}, srun); }).empty());
}

TEST_CASE("launch policy: --nnodes needs no launcher - a node rank inside it - MASTER_ADDR and a port",
          "[runtime][launch]") {
  LaunchEnvironment standalone, mpi;
  mpi.launcher = "openmpi";
  const auto both = environment({{"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"}});
  CHECK(refusal([&] { check_launch_request({8, 2, 1}, standalone, both); }).empty());
  CHECK_THAT(refusal([&] { check_launch_request({8, 2, 0}, mpi, both); }),
             Catch::Contains("--nnodes 2 given, but the job was already started by a launcher (openmpi)"));
  CHECK_THAT(refusal([&] { check_launch_request({8, 2, 2}, standalone, both); }),
             Catch::Contains("--node-rank 2 is not a node of --nnodes 2; use 0 to 1"));
  CHECK_THAT(refusal([&] { check_launch_request({8, 2, 1}, standalone, environment({{"MASTER_ADDR", "node1"}})); }),
             Catch::Contains("--nnodes 2 needs MASTER_ADDR and MASTER_PORT"));
  const LocalLaunchOptions launch = local_launch_options({8, 2, 1}, both);
  CHECK(launch.nproc == 8);
  CHECK(launch.node_rank == 1);
  CHECK(launch.master_addr == "node1");
  CHECK(launch.master_port == 29500);
  CHECK_THAT(refusal([&] { local_launch_options({8, 2, 1}, environment({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}})); }),
             Catch::Contains("MASTER_PORT=70000 is not a TCP port (1-65535)"));
}
