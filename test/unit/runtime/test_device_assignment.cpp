// parallel.backend, --cpu and the GPUs of a node decide each worker's device and backend before
// anything starts; impossible layouts are refused with the field named.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "runtime/device_assignment.h"

using trainer::UserError;
using trainer::runtime::assign_device;
using trainer::runtime::DeviceRequest;

namespace {

DeviceRequest request(const std::string& backend, int64_t local_rank, int64_t local_world_size, int gpus,
                      bool cpu = false) {
  DeviceRequest r;
  r.backend = *trainer::recipe::enum_from_name<trainer::recipe::Backend>(backend);
  r.force_cpu = cpu;
  r.local_rank = local_rank;
  r.local_world_size = local_world_size;
  r.gpus = gpus;
  return r;
}

// The UserError's message; "" when nothing was refused (a failed check then shows the message).
std::string refusal(const DeviceRequest& r) {
  try {
    assign_device(r);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("device assignment: auto is NCCL with one GPU per local rank and Gloo on the CPU", "[runtime][device]") {
  const auto a = assign_device(request("auto", 3, 8, 8));
  CHECK(a.on_gpu);
  CHECK(a.nccl);
  CHECK(a.device_index == 3);
  CHECK(a.ranks_per_gpu == 1);
  for (const auto& cpu : {request("auto", 1, 4, 0), request("auto", 1, 4, 8, true), request("gloo", 1, 4, 0)}) {
    const auto c = assign_device(cpu);
    CHECK_FALSE(c.on_gpu);
    CHECK_FALSE(c.nccl);
    CHECK(c.device_index == -1);
  }
}

TEST_CASE("device assignment: gloo lets local ranks share GPUs round robin", "[runtime][device]") {
  // 5 workers on 2 GPUs: ranks 0, 2, 4 on GPU 0 and ranks 1, 3 on GPU 1.
  const int64_t expected_sharing[] = {3, 2, 3, 2, 3};
  for (int64_t rank = 0; rank < 5; ++rank) {
    const auto a = assign_device(request("gloo", rank, 5, 2));
    CHECK(a.on_gpu);
    CHECK_FALSE(a.nccl);
    CHECK(a.device_index == rank % 2);
    CHECK(a.ranks_per_gpu == expected_sharing[rank]);
  }
  const auto one = assign_device(request("gloo", 3, 4, 1));
  CHECK(one.device_index == 0);
  CHECK(one.ranks_per_gpu == 4);
}

TEST_CASE("device assignment: more workers than GPUs under NCCL and nccl without a GPU are refused",
          "[runtime][device]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(refusal(request("auto", 0, 2, 1)),
             Contains("2 workers on this node but 1 GPU:") && Contains("parallel.backend=\"gloo\""));
  CHECK_THAT(refusal(request("nccl", 0, 4, 2)), Contains("4 workers on this node but 2 GPUs"));
  CHECK_THAT(refusal(request("nccl", 0, 1, 0)), Contains("no usable CUDA device"));
  CHECK_THAT(refusal(request("nccl", 0, 1, 1, true)), Contains("--cpu was given"));
}
