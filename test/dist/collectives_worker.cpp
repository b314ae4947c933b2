// One rank of the collective tests: `collectives_worker TP CP DP PP ETP EP` with RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT in the environment. Builds the process groups of that mesh and, on
// every group of more than one rank, runs each collective with rank-dependent values and checks
// the result. Exit 0 when all match; otherwise prints the first mismatch and exits 1.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>

#include "mesh/process_groups.h"
#include "worker_groups.h"

using namespace trainer;

namespace {

void expect_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  if (!at::allclose(actual, expected, 1e-6, 1e-6))
    throw std::runtime_error(fmt::format("{}: got {} expected {}", what, actual.toString(), expected.toString()));
}

void check_group(comm::Communicator& g, int64_t global_rank) {
  const int64_t n = g.size(), r = g.rank();
  const std::string name = g.name();
  const auto f = at::kFloat;
  // Every member's global rank, in group order.
  const auto& members = g.global_ranks();
  const double sum_of_members = double(std::accumulate(members.begin(), members.end(), int64_t(0)));

  at::Tensor t = at::full({5}, double(global_rank + 1), f);
  g.all_reduce(t, comm::ReduceOp::Sum)->wait();
  expect_equal(t, at::full({5}, sum_of_members + double(n), f), name + " all_reduce sum");

  t = at::full({3}, double(global_rank), f);
  g.all_reduce(t, comm::ReduceOp::Avg)->wait();
  expect_equal(t, at::full({3}, sum_of_members / double(n), f), name + " all_reduce avg");

  t = at::full({2}, double(global_rank), f);
  g.all_reduce(t, comm::ReduceOp::Max)->wait();
  expect_equal(t, at::full({2}, double(*std::max_element(members.begin(), members.end())), f), name + " all_reduce max");

  // reduce_scatter: input element i on rank q is q*1000 + i; chunk r sums over q.
  const int64_t chunk = 3;
  at::Tensor input = at::arange(n * chunk, f) + double(global_rank) * 1000;
  at::Tensor out = at::empty({chunk}, f);
  g.reduce_scatter(out, input, comm::ReduceOp::Sum)->wait();
  expect_equal(out, (at::arange(chunk, f) + double(r * chunk)) * double(n) + sum_of_members * 1000,
               name + " reduce_scatter");

  // all_gather: rank q contributes [q, q, q] (global ranks).
  at::Tensor gathered = at::empty({n * 3}, f);
  g.all_gather(gathered, at::full({3}, double(global_rank), f))->wait();
  at::Tensor expected = at::empty({n * 3}, f);
  for (int64_t q = 0; q < n; ++q) expected.narrow(0, q * 3, 3).fill_(double(members[q]));
  expect_equal(gathered, expected, name + " all_gather");

  // all_gather in place (the input is this rank's chunk of the output), bit for bit: signed zeros,
  // infinities and NaN travel unchanged (Gloo gathers by an all-reduce over -0.0 elsewhere).
  {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    auto special = [&](int64_t q) {
      return at::tensor({-0.0, 0.0, inf, -inf, nan, double(members[q]) + 0.25}, at::TensorOptions().dtype(f));
    };
    at::Tensor all = at::empty({n * 6}, f);
    at::Tensor mine = all.narrow(0, r * 6, 6);
    mine.copy_(special(r));
    g.all_gather(all, mine)->wait();
    at::Tensor expected_bits = at::empty({n * 6}, f);
    for (int64_t q = 0; q < n; ++q) expected_bits.narrow(0, q * 6, 6).copy_(special(q));
    if (!at::equal(all.view(at::kInt), expected_bits.view(at::kInt)))
      throw std::runtime_error(fmt::format("{} all_gather in place: got {} expected {}", name, all.toString(),
                                           expected_bits.toString()));
  }

  // reduce_scatter_consuming with the output a view of the input (ZeRO's buckets): the same sums.
  {
    at::Tensor bucket = at::arange(n * chunk, f) + double(global_rank) * 1000;
    at::Tensor shard = bucket.narrow(0, r * chunk, chunk);
    g.reduce_scatter_consuming(shard, bucket, comm::ReduceOp::Sum)->wait();
    expect_equal(shard, (at::arange(chunk, f) + double(r * chunk)) * double(n) + sum_of_members * 1000,
                 name + " reduce_scatter_consuming in place");
    at::Tensor separate = at::empty({chunk}, f);
    at::Tensor input2 = at::arange(n * chunk, f) + double(global_rank) * 1000;
    g.reduce_scatter_consuming(separate, input2, comm::ReduceOp::Avg)->wait();
    expect_equal(separate, (at::arange(chunk, f) + double(r * chunk)) + sum_of_members * 1000 / double(n),
                 name + " reduce_scatter_consuming avg");
  }

  // all_to_all with uneven splits: rank r sends (j + 1) rows of value r*100 + j to rank j.
  std::vector<int64_t> in_splits, out_splits;
  for (int64_t j = 0; j < n; ++j) in_splits.push_back(j + 1);
  for (int64_t j = 0; j < n; ++j) out_splits.push_back(r + 1);
  at::Tensor send = at::empty({std::accumulate(in_splits.begin(), in_splits.end(), int64_t(0)), 2}, f);
  int64_t row = 0;
  for (int64_t j = 0; j < n; ++j) {
    send.narrow(0, row, j + 1).fill_(double(r * 100 + j));
    row += j + 1;
  }
  at::Tensor receive = at::empty({n * (r + 1), 2}, f);
  g.all_to_all(receive, send, out_splits, in_splits)->wait();
  for (int64_t j = 0; j < n; ++j)
    expect_equal(receive.narrow(0, j * (r + 1), r + 1), at::full({r + 1, 2}, double(j * 100 + r), f),
                 name + " all_to_all");
  // The last rank sends nothing (zero rows) and still receives a row from every rank (Muon's
  // exchange and a rank routing no tokens do this).
  if (n > 1) {
    const bool last = r == n - 1;
    std::vector<int64_t> send_rows(size_t(n), 0), receive_rows(size_t(n), 0);
    if (last)
      for (int64_t j = 0; j + 1 < n; ++j) receive_rows[size_t(j)] = 1;
    else
      send_rows[size_t(n - 1)] = 1;
    at::Tensor nothing_or_one = at::full({last ? 0 : 1, 3}, double(r), f), got = at::empty({last ? n - 1 : 0, 3}, f);
    g.all_to_all(got, nothing_or_one, receive_rows, send_rows)->wait();
    if (last)
      for (int64_t j = 0; j + 1 < n; ++j)
        expect_equal(got.narrow(0, j, 1), at::full({1, 3}, double(j), f), name + " all_to_all from an empty send");
  }

  // Batched send/recv around the ring.
  at::Tensor to_next = at::full({4}, double(global_rank), f), from_prev = at::empty({4}, f);
  g.send_recv({{comm::P2POp::Kind::Send, to_next, (r + 1) % n}, {comm::P2POp::Kind::Recv, from_prev, (r + n - 1) % n}})
      ->wait();
  expect_equal(from_prev, at::full({4}, double(members[(r + n - 1) % n]), f), name + " send/recv");

  // Two messages of the same shape to one peer, told apart by their tags: the receiver posts its
  // receives in the opposite order (in one batch, then in two batches), and each lands in its buffer.
  if (n >= 2 && r < 2) {
    const int64_t peer = 1 - r;
    if (r == 0) {
      for (int round = 0; round < 2; ++round) {
        at::Tensor first = at::full({6}, 1.0 + round, f), second = at::full({6}, 10.0 + round, f);
        g.send_recv({{comm::P2POp::Kind::Send, first, peer, 7}, {comm::P2POp::Kind::Send, second, peer, 8}})->wait();
      }
    } else {
      at::Tensor second = at::empty({6}, f), first = at::empty({6}, f);
      g.send_recv({{comm::P2POp::Kind::Recv, second, peer, 8}, {comm::P2POp::Kind::Recv, first, peer, 7}})->wait();
      expect_equal(first, at::full({6}, 1.0, f), name + " tagged recv (one batch), tag 7");
      expect_equal(second, at::full({6}, 10.0, f), name + " tagged recv (one batch), tag 8");
      // Across batches (Gloo, which these tests run on; NCCL matches batches in posting order).
      auto late = g.send_recv({{comm::P2POp::Kind::Recv, second, peer, 8}});
      auto early = g.send_recv({{comm::P2POp::Kind::Recv, first, peer, 7}});
      late->wait();
      early->wait();
      expect_equal(first, at::full({6}, 2.0, f), name + " tagged recv (two batches), tag 7");
      expect_equal(second, at::full({6}, 11.0, f), name + " tagged recv (two batches), tag 8");
    }
  }
  try {
    g.send_recv({{comm::P2POp::Kind::Send, to_next, (r + 1) % n, -1}});
    throw std::runtime_error(name + ": a negative tag was accepted");
  } catch (const comm::CommError&) {
  }

  // Wrong sizes are refused on every rank before anything is sent (with NCCL they would be writes
  // past a buffer): no rank waits for the others.
  auto refused = [&](const std::string& what, const std::function<void()>& call, const std::string& expected) {
    try {
      call();
    } catch (const comm::CommError& e) {
      if (std::string(e.what()).find(expected) == std::string::npos)
        throw std::runtime_error(name + " " + what + ": unexpected message: " + e.what());
      return;
    }
    throw std::runtime_error(name + " " + what + ": a wrong size was accepted");
  };
  at::Tensor small = at::empty({2}, f), big = at::empty({2 * n + 1}, f);
  refused("reduce_scatter", [&] { g.reduce_scatter(small, big, comm::ReduceOp::Sum); }, "expected output's 2 x");
  refused("all_gather", [&] { g.all_gather(big, small); }, "expected input's 2 x");
  refused("all_gather dtype", [&] { at::Tensor d = at::empty({2 * n}, at::kDouble); g.all_gather(d, small); },
          "input is Float but output is Double");
  std::vector<int64_t> ones(size_t(n), 1);
  refused("all_to_all", [&] { at::Tensor in = at::empty({n + 1, 2}, f), out = at::empty({n, 2}, f); g.all_to_all(out, in, ones, ones); },
          "but the splits add up to");
  refused("all_to_all splits", [&] { at::Tensor in = at::empty({1, 2}, f), out = at::empty({1, 2}, f); g.all_to_all(out, in, {1}, {1}); },
          "splits for a group of");
  refused("send to self", [&] { g.send_recv({{comm::P2POp::Kind::Send, small, r}}); }, "is not another rank");

  at::Tensor b = at::full({2}, r == n - 1 ? 42.0 : -1.0, f);
  g.broadcast(b, n - 1)->wait();
  expect_equal(b, at::full({2}, 42.0, f), name + " broadcast");
  g.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 7) throw std::runtime_error("usage: collectives_worker TP CP DP PP ETP EP");
    recipe::MeshShape s;
    s.tp = std::atoll(argv[1]), s.cp = std::atoll(argv[2]), s.dp = std::atoll(argv[3]), s.pp = std::atoll(argv[4]);
    s.etp = std::atoll(argv[5]), s.ep = std::atoll(argv[6]);
    s.world_size = s.tp * s.cp * s.dp * s.pp;
    s.edp = s.world_size / (s.etp * s.ep * s.pp);
    const auto owned = test::worker_groups(s);
    mesh::ProcessGroups& groups = *owned;
    const int64_t rank = groups.global_rank();
    // Kinds with the same ranks share one communicator, except that the expert groups (ep and etp;
    // edp) never share with the others; different ranks never do.
    const auto lane = [](mesh::GroupKind k) {
      return k == mesh::GroupKind::Ep || k == mesh::GroupKind::Etp ? 1 : k == mesh::GroupKind::Edp ? 2 : 0;
    };
    for (auto a : mesh::all_group_kinds())
      for (auto b : mesh::all_group_kinds()) {
        const bool same_ranks = groups.get(a).global_ranks() == groups.get(b).global_ranks() && lane(a) == lane(b);
        if (same_ranks != (&groups.get(a) == &groups.get(b)))
          throw std::runtime_error(fmt::format("groups {} and {}: same ranks {} but shared communicator {}",
                                               mesh::group_kind_name(a), mesh::group_kind_name(b), same_ranks,
                                               &groups.get(a) == &groups.get(b)));
      }
    if (s.cp == 1 && s.dp > 1 && groups.get(mesh::GroupKind::Dp).name().find("dp_cp") == std::string::npos)
      throw std::runtime_error("dp and dp_cp have the same ranks but the communicator is named " +
                               groups.get(mesh::GroupKind::Dp).name());
    int checked = 0;
    for (auto kind : mesh::all_group_kinds()) {
      auto& g = groups.get(kind);
      if (g.size() > 1) {
        check_group(g, rank);
        ++checked;
      }
    }
    check_group(groups.world(), rank);
    std::printf("rank %lld: %d groups checked\n", (long long)rank, checked + 1);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_worker: %s\n", e.what());
    return 1;
  }
}
