#include <catch2/catch.hpp>

#include <map>

#include "core/error.h"
#include "runtime/launch_env.h"

using namespace trainer;

namespace {
runtime::LaunchEnvironment detect(const std::map<std::string, std::string>& vars) {
  return runtime::detect_launch_environment([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}
}  // namespace

TEST_CASE("launch: no launcher means one process on 127.0.0.1", "[runtime]") {
  const auto e = detect({});
  CHECK(e.launcher == "none");
  CHECK(e.world_size == 1);
  CHECK(e.master_addr == "127.0.0.1");
}

TEST_CASE("launch: torchrun-style variables", "[runtime]") {
  const auto e = detect({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "1234"}});
  CHECK(e.launcher == "env");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "10.0.0.5");
  CHECK(e.master_port == 1234);
}

TEST_CASE("launch: OpenMPI variables", "[runtime]") {
  const auto e = detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(e.launcher == "openmpi");
  CHECK(e.rank == 1);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "127.0.0.1");  // one node
  CHECK(e.master_port == 29500);
}

TEST_CASE("launch: a multi-node MPI job needs MASTER_ADDR", "[runtime]") {
  CHECK_THROWS_WITH(detect({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "16"},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}}),
                    Catch::Contains("needs MASTER_ADDR"));
}

TEST_CASE("launch: MPICH PMI variables", "[runtime]") {
  const auto e = detect({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "4"}});
  CHECK(e.launcher == "pmi");
  CHECK(e.rank == 2);
  CHECK(e.local_rank == 2);
}

TEST_CASE("launch: Slurm variables with the first host as the master", "[runtime]") {
  const auto e = detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "8(x2)"},
                         {"SLURM_JOB_NODELIST", "gpu[07-08],login1"}, {"SLURM_JOB_ID", "123456"}});
  CHECK(e.launcher == "slurm");
  CHECK(e.rank == 5);
  CHECK(e.local_rank == 1);
  CHECK(e.nodes == std::vector<std::string>{"gpu07", "gpu08", "login1"});
  CHECK(e.master_addr == "gpu07");
  CHECK(e.master_port == 20000 + 123456 % 12000);
  CHECK(e.local_world_size == 8);
}

TEST_CASE("launch: inconsistent or malformed values are user errors", "[runtime]") {
  CHECK_THROWS_AS(detect({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), UserError);
  CHECK_THROWS_AS(detect({{"RANK", "x"}, {"WORLD_SIZE", "4"}}), UserError);
  CHECK_THROWS_AS(detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}), UserError);
}

TEST_CASE("hostlist expansion", "[runtime]") {
  using runtime::expand_hostlist;
  CHECK(expand_hostlist("node1") == std::vector<std::string>{"node1"});
  CHECK(expand_hostlist("node[1-3]") == std::vector<std::string>{"node1", "node2", "node3"});
  CHECK(expand_hostlist("node[01-03,07],gpu5") ==
        std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu5"});
  CHECK(expand_hostlist("r[1-2]n[08-09]") == std::vector<std::string>{"r1n08", "r1n09", "r2n08", "r2n09"});
  CHECK(expand_hostlist("a[098-101]") == std::vector<std::string>{"a098", "a099", "a100", "a101"});
  CHECK_THROWS_AS(expand_hostlist("node[1-"), UserError);
  CHECK_THROWS_AS(expand_hostlist("node[3-1]"), UserError);
  CHECK_THROWS_AS(expand_hostlist("node[a-b]"), UserError);
  CHECK_THROWS_AS(expand_hostlist("node[1-99999999999999999999]"), UserError);  // was std::out_of_range
  CHECK_THROWS_AS(expand_hostlist("a[1-99999]b[1-99999]"), UserError);         // 10^10 names
}

TEST_CASE("launch: a restarted job's variables - its count and cause and first start and failure directory", "[runtime]") {
  const auto e = detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"TRAINER_RESTART", "2"},
                         {"TRAINER_RESTART_CAUSE", "worker rank 1 was killed by signal 9"},
                         {"TRAINER_RESTART_SINCE", "1790000000"}, {"TRAINER_FAILURE_DIR", "/tmp/f"}});
  CHECK(e.restart == 2);
  CHECK(e.restart_cause == "worker rank 1 was killed by signal 9");
  CHECK(e.restart_since == 1790000000);
  CHECK(e.failure_dir == "/tmp/f");
  const auto first = detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  CHECK(first.restart == 0);
  CHECK(first.failure_dir.empty());
  CHECK_THROWS_AS(detect({{"TRAINER_RESTART", "two"}}), UserError);
  CHECK_THROWS_AS(detect({{"TRAINER_RESTART", "-1"}}), UserError);
}
