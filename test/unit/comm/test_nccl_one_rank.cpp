// NCCL on the one GPU a test machine has: a group of one rank built directly (the mesh gives
// one-rank groups the free backend, so no training run ever exercises NCCL on a single GPU).
// Without a GPU it only warns: NCCL cannot run on the CPU.
#include <catch2/catch.hpp>

#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/nccl_communicator.h"

using namespace trainer::comm;

TEST_CASE("NCCL collectives on one rank when there is a GPU", "[comm][cuda]") {
  if (!at::hasCUDA() || at::getNumGPUs() == 0) {
    WARN("no CUDA device: NCCL not exercised");
    return;
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto context = std::make_shared<CommContext>();
  context->timeout = std::chrono::seconds(60);
  auto comm = make_nccl_communicator(store, "pg/test/0", "dp", {0}, 0, context, 0);
  REQUIRE(comm->size() == 1);
  REQUIRE(comm->rank() == 0);
  const auto on_gpu = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0);
  const at::Tensor reference = at::randn({1000, 7}, on_gpu);

  SECTION("all_reduce sum and avg leave one rank's tensor as it is") {
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      at::Tensor t = reference.clone();
      comm->all_reduce(t, op)->wait();
      CHECK(at::equal(t.cpu(), reference.cpu()));
    }
  }
  SECTION("all_gather, reduce_scatter and broadcast") {
    at::Tensor gathered = at::zeros({1000, 7}, on_gpu);
    comm->all_gather(gathered, reference)->wait();
    CHECK(at::equal(gathered.cpu(), reference.cpu()));
    at::Tensor scattered = at::zeros({1000, 7}, on_gpu);
    comm->reduce_scatter(scattered, reference, ReduceOp::Sum)->wait();
    CHECK(at::equal(scattered.cpu(), reference.cpu()));
    at::Tensor b = reference.clone();
    comm->broadcast(b, 0)->wait();
    CHECK(at::equal(b.cpu(), reference.cpu()));
  }
  SECTION("all_to_all with a bf16 tensor") {
    const at::Tensor x = at::arange(600, on_gpu).to(at::kBFloat16).view({100, 6});
    at::Tensor y = at::zeros({100, 6}, x.options());
    comm->all_to_all(y, x, {100}, {100})->wait();
    CHECK(at::equal(y.cpu(), x.cpu()));
  }
  SECTION("point-to-point with itself is refused (a pipeline never sends to its own stage)") {
    at::Tensor received = at::zeros({1000, 7}, on_gpu);
    CHECK_THROWS_WITH(comm->send_recv({{P2POp::Kind::Send, reference, 0, 3}, {P2POp::Kind::Recv, received, 0, 3}}),
                      Catch::Contains("is not another rank of this group"));
  }
}
