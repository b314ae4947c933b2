#include <catch2/catch.hpp>

#include "estimate/comm_model.h"

using namespace trainer::estimate;

namespace {
HardwareProfile simple() {
  HardwareProfile p;
  p.nvlink = {100e9, 1e-6, 1.0};
  p.network = {10e9, 10e-6, 1.0};
  return p;
}
}  // namespace

TEST_CASE("ring collectives in the alpha-beta model - by hand", "[estimate]") {
  const auto gpu = simple();
  GroupPlacement g8;
  g8.size = 8;
  // All-reduce of 800 MB over 8 ranks on NVLink: 2*7 steps of 1 us + 2*7/8 * 800e6/100e9 s.
  CHECK(collective_seconds(CommKind::AllReduce, 800e6, g8, gpu) == Approx(14e-6 + 2 * 7.0 / 8 * 8e-3));
  CHECK(collective_seconds(CommKind::AllGather, 800e6, g8, gpu) == Approx(7e-6 + 7.0 / 8 * 8e-3));
  CHECK(collective_seconds(CommKind::ReduceScatter, 800e6, g8, gpu) ==
        collective_seconds(CommKind::AllGather, 800e6, g8, gpu));
  g8.crosses_nodes = true;
  CHECK(collective_seconds(CommKind::AllGather, 800e6, g8, gpu) == Approx(70e-6 + 7.0 / 8 * 80e-3));
  GroupPlacement one;
  CHECK(collective_seconds(CommKind::AllReduce, 1e9, one, gpu) == 0);
  CHECK(collective_seconds(CommKind::SendRecv, 1e9, one, gpu) == Approx(1e-6 + 1e-2));
}

TEST_CASE("which groups leave a node follows from the rank order tp-cp-ep-dp-pp", "[estimate]") {
  trainer::recipe::MeshShape m;
  m.world_size = 128;
  m.tp = 8;
  m.cp = 2;
  m.dp = 4;
  m.pp = 2;
  m.etp = 1;
  m.ep = 8;
  m.edp = 8;
  const auto p = place_groups(m, 8);
  CHECK_FALSE(p.tp.crosses_nodes);  // ranks 0..7
  CHECK(p.cp.crosses_nodes);        // stride 8
  CHECK(p.dp.crosses_nodes);
  CHECK(p.pp.crosses_nodes);
  CHECK(p.dp_cp.size == 8);
  CHECK_FALSE(p.ep.crosses_nodes);  // experts: etp 1, ep 8 contiguous
  CHECK(p.edp.crosses_nodes);
  const auto wide = place_groups(m, 16);
  CHECK_FALSE(wide.cp.crosses_nodes);  // 2 x 8 ranks fit a 16-GPU domain
}
