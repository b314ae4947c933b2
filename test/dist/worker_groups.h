#pragma once
// The process groups of one test worker: rank and world size from the environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Gloo on the loopback interface, 60-second timeouts.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>

#include "mesh/process_groups.h"
#include "runtime/launch_env.h"
#include "runtime/rendezvous.h"

namespace trainer::test {

inline std::unique_ptr<mesh::ProcessGroups> worker_groups(const recipe::MeshShape& shape) {
  const auto env = runtime::detect_launch_environment();
  const auto store = runtime::connect_rendezvous(env, std::chrono::seconds(60));
  auto context = std::make_shared<comm::CommContext>();
  context->global_rank = env.rank;
  context->timeout = std::chrono::seconds(60);
  mesh::Backend backend;
  backend.interface_address = "127.0.0.1";
  return std::make_unique<mesh::ProcessGroups>(mesh::RankLayout(shape), env.rank, store, context, backend);
}

}  // namespace trainer::test
