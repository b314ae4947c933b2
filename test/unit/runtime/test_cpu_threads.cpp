#include <catch2/catch.hpp>

#include <map>

#include "core/error.h"
#include "runtime/cpu_threads.h"

using namespace trainer;

namespace {
runtime::GetEnv env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("cpu threads: the node's cores are split among its workers", "[runtime]") {
  auto t = runtime::choose_cpu_threads(2, env_of({}), 2, 2);
  CHECK(t.threads == 1);
  CHECK(t.reason == "2 cores / 2 local workers");
  t = runtime::choose_cpu_threads(3, env_of({}), 16, 16);
  CHECK(t.threads == 5);
  CHECK(runtime::choose_cpu_threads(1, env_of({}), 16, 16).threads == 16);
  CHECK(runtime::choose_cpu_threads(8, env_of({}), 2, 2).threads == 1);  // never 0
}

TEST_CASE("cpu threads: OMP_NUM_THREADS and a launcher's core binding win", "[runtime]") {
  auto t = runtime::choose_cpu_threads(2, env_of({{"OMP_NUM_THREADS", "3"}}), 2, 2);
  CHECK(t.threads == 3);
  CHECK(t.reason == "OMP_NUM_THREADS=3");
  t = runtime::choose_cpu_threads(4, env_of({}), 64, 8);  // mpirun --bind-to with 8 cores each
  CHECK(t.threads == 8);
  CHECK(t.reason == "the 8 cores this process is bound to");
  CHECK_THROWS_AS(runtime::choose_cpu_threads(2, env_of({{"OMP_NUM_THREADS", "two"}}), 2, 2), UserError);
  CHECK_THROWS_AS(runtime::choose_cpu_threads(2, env_of({{"OMP_NUM_THREADS", "0"}}), 2, 2), UserError);
}
