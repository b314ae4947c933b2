#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "mesh/rank_layout.h"

using namespace trainer;
using mesh::GroupKind;

namespace {
recipe::MeshShape shape(int64_t tp, int64_t cp, int64_t dp, int64_t pp, int64_t etp, int64_t ep) {
  recipe::MeshShape s;
  s.tp = tp, s.cp = cp, s.dp = dp, s.pp = pp, s.etp = etp, s.ep = ep;
  s.world_size = tp * cp * dp * pp;
  s.edp = s.world_size / (etp * ep * pp);
  return s;
}

using Groups = std::vector<std::vector<int64_t>>;

// Independent expectation: enumerate coordinates with nested loops in Megatron's order and
// collect, for each group kind, the ranks that share every other coordinate.
std::map<GroupKind, Groups> brute_force(const recipe::MeshShape& s) {
  std::map<GroupKind, std::map<std::vector<int64_t>, std::vector<int64_t>>> keyed;
  int64_t rank = 0;
  for (int64_t pp = 0; pp < s.pp; ++pp)
    for (int64_t dp = 0; dp < s.dp; ++dp)
      for (int64_t cp = 0; cp < s.cp; ++cp)
        for (int64_t tp = 0; tp < s.tp; ++tp, ++rank) {
          keyed[GroupKind::Tp][{cp, dp, pp}].push_back(rank);
          keyed[GroupKind::Cp][{tp, dp, pp}].push_back(rank);
          keyed[GroupKind::Dp][{tp, cp, pp}].push_back(rank);
          keyed[GroupKind::Pp][{tp, cp, dp}].push_back(rank);
          keyed[GroupKind::DpCp][{tp, pp}].push_back(rank);
          keyed[GroupKind::TpCp][{dp, pp}].push_back(rank);
          keyed[GroupKind::TpDpCp][{pp}].push_back(rank);
          keyed[GroupKind::DpCpShard][{tp, pp}].push_back(rank);  // no hybrid sharding: dp x cp
          keyed[GroupKind::DpCpReplicate][{tp, cp, dp, pp}].push_back(rank);
        }
  rank = 0;
  for (int64_t pp = 0; pp < s.pp; ++pp)
    for (int64_t edp = 0; edp < s.edp; ++edp)
      for (int64_t ep = 0; ep < s.ep; ++ep)
        for (int64_t etp = 0; etp < s.etp; ++etp, ++rank) {
          keyed[GroupKind::Etp][{ep, edp, pp}].push_back(rank);
          keyed[GroupKind::Ep][{etp, edp, pp}].push_back(rank);
          keyed[GroupKind::Edp][{etp, ep, pp}].push_back(rank);
        }
  std::map<GroupKind, Groups> out;
  for (auto& [kind, groups] : keyed) {
    for (auto& [key, members] : groups) out[kind].push_back(members);
    std::sort(out[kind].begin(), out[kind].end());
  }
  return out;
}
}  // namespace

TEST_CASE("mesh: Megatron's 16-rank example (TP2 CP2 PP2 DP2 - ETP1 EP4 EDP2)", "[mesh]") {
  const mesh::RankLayout layout(shape(2, 2, 2, 2, 1, 4));
  CHECK(layout.all_groups(GroupKind::Tp) == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(layout.all_groups(GroupKind::Cp) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(layout.all_groups(GroupKind::Dp) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(layout.all_groups(GroupKind::Pp) == Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(layout.all_groups(GroupKind::DpCp) == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(layout.all_groups(GroupKind::TpCp) == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  CHECK(layout.all_groups(GroupKind::TpDpCp) == Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  CHECK(layout.index_in(GroupKind::DpCp, 6) == 3);
  CHECK(layout.all_groups(GroupKind::Ep) == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  CHECK(layout.all_groups(GroupKind::Edp) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(layout.all_groups(GroupKind::Etp).size() == 16);
  CHECK(layout.all_groups(GroupKind::Embedding) == layout.all_groups(GroupKind::Pp));  // pp = 2: first and last
  const auto c = layout.coordinates(13);
  CHECK(c.tp == 1);
  CHECK(c.cp == 0);
  CHECK(c.dp == 1);
  CHECK(c.pp == 1);
  CHECK(c.ep == 1);
  CHECK(c.edp == 1);
}

TEST_CASE("mesh: hybrid sharding splits dp x cp into shard groups inside a node and replica groups across", "[mesh]") {
  // TP2 CP1 DP4 PP1 with dp_shard 2: shard groups of dp positions {0,1} and {2,3} (stride tp),
  // replicas at the same position in each.
  auto s = shape(2, 1, 4, 1, 1, 1);
  s.dp_shard = 2;
  const mesh::RankLayout layout(s);
  CHECK(layout.all_groups(GroupKind::DpCpShard) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(layout.all_groups(GroupKind::DpCpReplicate) == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // With cp 2 the shard group holds both cp ranks of its dp positions; dp 6 in shards of 3.
  auto t = shape(1, 2, 6, 1, 1, 1);
  t.dp_shard = 3;
  const mesh::RankLayout hybrid(t);
  CHECK(hybrid.all_groups(GroupKind::DpCpShard) == Groups{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}});
  CHECK(hybrid.all_groups(GroupKind::DpCpReplicate) == Groups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}});
  CHECK(hybrid.index_in(GroupKind::DpCpShard, 8) == 2);
  // Without hybrid sharding the shard group is dp x cp and the replica groups single ranks.
  const mesh::RankLayout plain(shape(2, 2, 2, 1, 1, 1));
  CHECK(plain.all_groups(GroupKind::DpCpShard) == plain.all_groups(GroupKind::DpCp));
  CHECK(plain.all_groups(GroupKind::DpCpReplicate).size() == 8);
  auto bad = shape(1, 1, 4, 1, 1, 1);
  bad.dp_shard = 3;
  CHECK_THROWS(mesh::RankLayout(bad));
}

TEST_CASE("mesh: groups match a brute-force enumeration for many meshes", "[mesh]") {
  int checked = 0;
  for (int64_t tp : {1, 2, 4})
    for (int64_t cp : {1, 2})
      for (int64_t dp : {1, 2, 3, 4})
        for (int64_t pp : {1, 2, 3})
          for (int64_t etp : {1, 2})
            for (int64_t ep : {1, 2, 4, 8}) {
              const int64_t world = tp * cp * dp * pp;
              if ((world / pp) % (etp * ep) != 0) continue;
              const auto s = shape(tp, cp, dp, pp, etp, ep);
              const mesh::RankLayout layout(s);
              const auto expected = brute_force(s);
              INFO("tp " << tp << " cp " << cp << " dp " << dp << " pp " << pp << " etp " << etp << " ep " << ep);
              for (const auto& [kind, groups] : expected) {
                auto actual = layout.all_groups(kind);
                for (auto& g : actual) std::sort(g.begin(), g.end());
                std::sort(actual.begin(), actual.end());
                CHECK(actual == groups);
              }
              // Pipeline groups of the dense and the expert view coincide (MoE folding).
              for (int64_t r = 0; r < world; ++r) {
                CHECK(layout.coordinates(r).pp == r / (world / pp));
                CHECK(layout.dense_rank(layout.coordinates(r).tp, layout.coordinates(r).cp, layout.coordinates(r).dp,
                                        layout.coordinates(r).pp) == r);
                CHECK(layout.expert_rank(layout.coordinates(r).etp, layout.coordinates(r).ep, layout.coordinates(r).edp,
                                         layout.coordinates(r).pp) == r);
              }
              ++checked;
            }
  CHECK(checked > 100);
}

TEST_CASE("mesh: embedding groups hold the first and last pipeline stage", "[mesh]") {
  const mesh::RankLayout layout(shape(1, 1, 2, 4, 1, 1));  // ranks: pp-major, dp inner
  CHECK(layout.all_groups(GroupKind::Embedding) == Groups{{0, 6}, {1, 7}});
  CHECK(layout.group(GroupKind::Embedding, 2) == std::vector<int64_t>{2});  // a middle stage: itself only
  CHECK(layout.group(GroupKind::Embedding, 7) == std::vector<int64_t>{1, 7});
}
