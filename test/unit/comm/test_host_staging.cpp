// Gloo through pinned host memory (parallel.backend "gloo" on GPUs): two ranks of one Gloo group,
// one thread each in this process, run every operation on CUDA tensors and get the values a
// two-rank collective must give (sums, chunks, exchanged rows), in the tensors they passed, with
// later work on the stream seeing them. Without a GPU the same operations run on CPU tensors,
// which the wrapper hands to Gloo untouched.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <thread>

#include "comm/gloo_communicator.h"
#include "comm/host_staging_communicator.h"

using namespace trainer::comm;

namespace {

// Runs `body(rank, communicator)` on two threads, one per rank of a staged Gloo group.
void on_two_ranks(const std::function<void(int64_t, Communicator&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::exception_ptr failures[2];
  auto rank_main = [&](int64_t rank) {
    try {
      auto context = std::make_shared<CommContext>();
      context->global_rank = rank;
      context->timeout = std::chrono::seconds(60);
      auto comm = stage_through_host(make_gloo_communicator(store, "pg/dp/0", "dp", {0, 1}, rank, context, "127.0.0.1"));
      body(rank, *comm);
    } catch (...) {
      failures[rank] = std::current_exception();
    }
  };
  std::thread other(rank_main, 1);
  rank_main(0);
  other.join();
  for (auto& f : failures)
    if (f) std::rethrow_exception(f);
}

at::Device device() { return at::hasCUDA() && at::getNumGPUs() > 0 ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU); }

// Rank r's input: distinct values per rank and element.
at::Tensor input(int64_t rank, int64_t rows, int64_t cols) {
  return (at::arange(rows * cols, at::kFloat).view({rows, cols}) + 1000.0 * double(rank)).to(device());
}

}  // namespace

TEST_CASE("Gloo staged through host memory gives every operation's two-rank result in CUDA tensors",
          "[comm][cuda]") {
  if (device().is_cpu()) WARN("no CUDA device: the staged operations run on CPU tensors (passed through)");
  std::mutex mutex;  // Catch's assertions are not thread-safe
  auto check = [&](bool ok, const char* what, int64_t rank) {
    const std::lock_guard<std::mutex> lock(mutex);
    INFO(what << " on rank " << rank);
    CHECK(ok);
  };
  on_two_ranks([&](int64_t rank, Communicator& comm) {
    const at::Tensor a0 = input(0, 6, 5).cpu(), a1 = input(1, 6, 5).cpu(), mine = input(rank, 6, 5);
    // All-reduce: sum, average, maximum; a later op on the stream reads the result.
    for (const auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      at::Tensor t = mine.clone();
      comm.all_reduce(t, op)->wait();
      const at::Tensor doubled = (t * 2).cpu();  // queued after the copy back
      const at::Tensor want = op == ReduceOp::Sum ? a0 + a1 : op == ReduceOp::Avg ? (a0 + a1) / 2 : at::maximum(a0, a1);
      check(t.device() == device() && at::allclose(doubled, want * 2), "all_reduce", rank);
    }
    // Reduce-scatter: this rank's half of the sum (rows 3r..3r+2), into a separate output and into
    // a view of its own input (the consuming form).
    at::Tensor half = at::zeros({3, 5}, mine.options());
    comm.reduce_scatter(half, mine, ReduceOp::Sum)->wait();
    check(at::equal(half.cpu(), (a0 + a1).narrow(0, 3 * rank, 3)), "reduce_scatter", rank);
    at::Tensor consumed = mine.clone();
    at::Tensor view = consumed.narrow(0, 3 * rank, 3);
    comm.reduce_scatter_consuming(view, consumed, ReduceOp::Avg)->wait();
    check(at::allclose(view.cpu(), ((a0 + a1) / 2).narrow(0, 3 * rank, 3)), "reduce_scatter_consuming", rank);
    // All-gather in place: the input is this rank's chunk of the output.
    at::Tensor gathered = at::full({12, 5}, -7.0, mine.options());
    gathered.narrow(0, 6 * rank, 6).copy_(mine);
    comm.all_gather(gathered, gathered.narrow(0, 6 * rank, 6))->wait();
    check(at::equal(gathered.cpu(), at::cat({a0, a1})), "all_gather", rank);
    // All-to-all with uneven splits: rank 0 sends rows [0,2) to itself and [2,6) to rank 1; rank 1
    // sends [0,5) to rank 0 and [5,6) to itself.
    const std::vector<int64_t> in_splits = rank == 0 ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{5, 1};
    const std::vector<int64_t> out_splits = rank == 0 ? std::vector<int64_t>{2, 5} : std::vector<int64_t>{4, 1};
    at::Tensor exchanged = at::zeros({rank == 0 ? 7 : 5, 5}, mine.options());
    comm.all_to_all(exchanged, mine, out_splits, in_splits)->wait();
    const at::Tensor want_a2a = rank == 0 ? at::cat({a0.narrow(0, 0, 2), a1.narrow(0, 0, 5)})
                                          : at::cat({a0.narrow(0, 2, 4), a1.narrow(0, 5, 1)});
    check(at::equal(exchanged.cpu(), want_a2a), "all_to_all", rank);
    // Point-to-point: each rank sends its input and receives the other's, two tags.
    at::Tensor received = at::zeros({6, 5}, mine.options()), received_twice = at::zeros({6, 5}, mine.options());
    comm.send_recv({{P2POp::Kind::Send, mine, 1 - rank, 1},
                    {P2POp::Kind::Send, mine * 2, 1 - rank, 2},
                    {P2POp::Kind::Recv, received_twice, 1 - rank, 2},
                    {P2POp::Kind::Recv, received, 1 - rank, 1}})
        ->wait();
    const at::Tensor other = rank == 0 ? a1 : a0;
    check(at::equal(received.cpu(), other) && at::equal(received_twice.cpu(), other * 2), "send_recv", rank);
    // Broadcast from rank 1.
    at::Tensor b = mine.clone();
    comm.broadcast(b, 1)->wait();
    check(at::equal(b.cpu(), a1), "broadcast", rank);
    comm.barrier();
  });
}
