// Straggler attribution's rule (train/straggler_judge.h): own time against the median of the other
// ranks' (with two ranks the other's), the threshold, the consecutive count, and nobody named when
// the ranks are equal.
#include <catch2/catch.hpp>

#include <vector>

#include "train/straggler_judge.h"

using namespace trainer::train;

namespace {

// A rank of a data-parallel step of `step` seconds that spent `own` of it on itself and waited
// the rest in the one group slot.
RankTimes rank_with_own(double own, double step = 2.0) {
  RankTimes t;
  t.step_s = step;
  t.compute_s = own;
  t.wait_s = step - own;
  t.group_waits_s = {0.0, step - own};
  return t;
}

// Every rank's own time from `own`, all with the same step time (the collectives equalise them).
std::vector<RankTimes> interval(const std::vector<double>& own) {
  std::vector<RankTimes> ranks;
  for (double o : own) ranks.push_back(rank_with_own(o));
  return ranks;
}

}  // namespace

TEST_CASE("straggler judge: own time is the step minus waits and data - never negative", "[train][straggler]") {
  RankTimes t;
  t.step_s = 1.0, t.wait_s = 0.3, t.data_s = 0.1;
  CHECK(t.own_s() == Approx(0.6));
  t.wait_s = 2.0;
  CHECK(t.own_s() == 0.0);
  CHECK(median({}) == 0.0);
  CHECK(median({3, 1, 2}) == 2.0);
  CHECK(median({4, 1, 2, 3}) == 2.5);
}

TEST_CASE("straggler judge: equal ranks - nobody named - ratios 1", "[train][straggler]") {
  StragglerJudge judge(1.15, 3);
  for (int i = 0; i < 20; ++i) {
    const StragglerVerdict v = judge.judge(interval({0.5, 0.5, 0.5, 0.5}), 5);
    CHECK(v.named.empty());
    CHECK(v.own_time_max_ratio == Approx(1.0));
    CHECK(v.step_time_max_ratio == Approx(1.0));
  }
}

TEST_CASE("straggler judge: one rank - nothing to compare", "[train][straggler]") {
  StragglerJudge judge(1.15, 1);
  const StragglerVerdict v = judge.judge(interval({0.9}), 1);
  CHECK(v.named.empty());
  CHECK(v.own_time_max_rank == -1);
}

TEST_CASE("straggler judge: named after N consecutive slow intervals - once - again after recovering", "[train][straggler]") {
  StragglerJudge judge(1.15, 3);
  const auto slow = interval({0.5, 0.8, 0.5, 0.5});  // rank 1 at 1.6x the others' median
  const auto equal = interval({0.5, 0.5, 0.5, 0.5});
  CHECK(judge.judge(slow, 5).named.empty());
  CHECK(judge.judge(slow, 5).named.empty());
  StragglerVerdict v = judge.judge(slow, 5);
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].rank == 1);
  CHECK(v.named[0].first);  // the line is printed now
  CHECK(v.named[0].steps == 15);
  CHECK(v.named[0].own_ratio == Approx(1.6));
  CHECK(v.own_time_max_rank == 1);
  CHECK(v.own_time_max_ratio == Approx(1.6));
  // Still slow: still named (the metrics key), no new line.
  v = judge.judge(slow, 5);
  REQUIRE(v.named.size() == 1);
  CHECK_FALSE(v.named[0].first);
  // Recovered: no longer named; a relapse needs N slow intervals again and prints again.
  CHECK(judge.judge(equal, 5).named.empty());
  CHECK(judge.judge(slow, 5).named.empty());
  CHECK(judge.judge(slow, 5).named.empty());
  v = judge.judge(slow, 5);
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].first);
}

TEST_CASE("straggler judge: the consecutive count resets on one interval under the threshold", "[train][straggler]") {
  StragglerJudge judge(1.15, 3);
  const auto slow = interval({0.5, 0.5, 0.7});
  const auto equal = interval({0.5, 0.5, 0.5});
  for (int i = 0; i < 5; ++i) {
    CHECK(judge.judge(slow, 1).named.empty());
    CHECK(judge.judge(slow, 1).named.empty());
    CHECK(judge.judge(equal, 1).named.empty());
  }
}

TEST_CASE("straggler judge: an interval not counted reports its ratios and leaves the counts", "[train][straggler]") {
  StragglerJudge judge(1.15, 2);
  const auto slow = interval({0.5, 0.8});
  const StragglerVerdict first = judge.judge(slow, 4, /*counted=*/false);
  CHECK(first.own_time_max_rank == 1);
  CHECK(first.own_time_max_ratio == Approx(1.6));
  CHECK(judge.judge(slow, 4).named.empty());  // the first counted slow interval
  const StragglerVerdict v = judge.judge(slow, 4);
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].steps == 8);  // the two counted intervals only
}

TEST_CASE("straggler judge: the threshold is strict - at it not slow - above it slow", "[train][straggler]") {
  StragglerJudge at(1.25, 1), above(1.25, 1);
  CHECK(at.judge(interval({1.0, 1.25, 1.0}), 1).named.empty());
  const StragglerVerdict v = above.judge(interval({1.0, 1.2501, 1.0}), 1);
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].rank == 1);
}

TEST_CASE("straggler judge: two ranks - the other rank's time is the reference", "[train][straggler]") {
  StragglerJudge judge(1.15, 2);
  const auto v1 = judge.judge(interval({0.3, 0.6}), 4);
  CHECK(v1.own_time_max_rank == 1);
  CHECK(v1.own_time_max_ratio == Approx(2.0));
  const auto v2 = judge.judge(interval({0.3, 0.6}), 4);
  REQUIRE(v2.named.size() == 1);
  CHECK(v2.named[0].rank == 1);
  CHECK(v2.named[0].own_ratio == Approx(2.0));
  CHECK(v2.named[0].others_own_s == Approx(0.3));
}

TEST_CASE("straggler judge: the median of the others ignores one fast outlier", "[train][straggler]") {
  // Rank 0 is unusually fast; rank 3 is slow against the median of 0.1, 0.5, 0.5 (0.5), not their mean.
  StragglerJudge judge(1.15, 1);
  const auto v = judge.judge(interval({0.1, 0.5, 0.5, 0.56}), 1);
  CHECK(v.named.empty());  // 0.56 / 0.5 = 1.12
  StragglerJudge judge2(1.15, 1);
  const auto w = judge2.judge(interval({0.1, 0.5, 0.5, 0.6}), 1);
  REQUIRE(w.named.size() == 1);
  CHECK(w.named[0].rank == 3);
}

TEST_CASE("straggler judge: step times alike - own times apart - the step-time ratio cannot tell", "[train][straggler]") {
  StragglerJudge judge(1.15, 1);
  auto ranks = interval({0.5, 0.5, 0.9});
  ranks[0].step_s = 2.02;  // a percent of jitter in the equalised step times
  const auto v = judge.judge(ranks, 1);
  CHECK(v.step_time_max_ratio == Approx(1.01));
  CHECK(v.own_time_max_ratio > 1.7);
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].rank == 2);
}

TEST_CASE("straggler judge: where the others wait - and the breakdown of the named rank", "[train][straggler]") {
  StragglerJudge judge(1.15, 2);
  auto ranks = interval({0.4, 0.8});
  ranks[1].data_s = 0.05, ranks[1].compute_s = 0.7, ranks[1].wait_s = 0.15;
  ranks[1].step_s = 1.0;  // own 0.8
  judge.judge(ranks, 3);
  const auto v = judge.judge(ranks, 1);
  REQUIRE(v.named.size() == 1);
  const StragglerFinding& f = v.named[0];
  CHECK(f.steps == 4);
  CHECK(f.mine.compute_s == Approx(0.7));
  CHECK(f.mine.data_s == Approx(0.05));
  CHECK(f.mine.own_s() == Approx(0.8));
  CHECK(f.others_wait_slot == 1);
  CHECK(f.others_wait_s == Approx(1.6));  // rank 0 waits 2.0 - 0.4 s per step
}

TEST_CASE("straggler judge: ranks compared within their cohort (pipeline stage) only", "[train][straggler]") {
  // Stage 1 (ranks 2, 3) does twice stage 0's work by design: not a straggler. Rank 3 is slow in its stage.
  StragglerJudge judge(1.15, 1, {0, 0, 1, 1});
  CHECK(judge.judge(interval({0.3, 0.3, 0.6, 0.6}), 1).named.empty());
  const auto v = judge.judge(interval({0.3, 0.3, 0.6, 0.8}), 1);
  REQUIRE(v.named.size() == 1);
  CHECK(v.named[0].rank == 3);
  // A rank alone in its cohort has no one to be compared with.
  StragglerJudge alone(1.15, 1, {0, 1});
  CHECK(alone.judge(interval({0.3, 0.9}), 1).named.empty());
}
