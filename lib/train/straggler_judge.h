#pragma once
// Who is slow, from every rank's figures of one logging interval (torch-free). In data
// parallelism the collectives make every rank's step time the slowest rank's, so step times
// cannot tell; a rank's own time (its step time minus its collective waits and its data wait) can:
// the slow rank waits for nobody, the others wait for it. A rank is slow in an interval when its
// own time exceeds the median of the other ranks' own times (with two ranks: the other's) by more
// than the threshold; it is named after `intervals` consecutive slow intervals. Ranks are compared
// only with ranks of their cohort (the same pipeline stage: the same layers, so the same work):
// pipeline stages that differ by design (the last one's output layer) are not stragglers.
#include <cstdint>
#include <deque>
#include <vector>

namespace trainer::train {

// One rank's figures over one logging interval, per step.
struct RankTimes {
  double step_s = 0;     // wall time
  double data_s = 0;     // building the micro-batches
  double compute_s = 0;  // forward + backward (collective waits excluded)
  double wait_s = 0;     // every collective wait
  // Waits by group: one slot per entry of a list every rank orders the same way.
  std::vector<double> group_waits_s;
  // Step time minus collective waits and data wait (never negative).
  double own_s() const;
};

// A rank named a straggler, with its figures over the slow intervals that named it.
struct StragglerFinding {
  int64_t rank = 0;
  double own_ratio = 0;   // its own time over the others' median, summed over those intervals
  int64_t steps = 0;      // the steps those intervals cover
  RankTimes mine;         // its per-step figures there
  double others_own_s = 0;  // the others' median own time per step there
  // The group slot the other ranks wait in most (their mean per step), -1 when none waits.
  int64_t others_wait_slot = -1;
  double others_wait_s = 0;
  bool first = false;     // named by this interval (slow `intervals` times in a row just now)
};

struct StragglerVerdict {
  // The largest own time over its cohort's others' median this interval (0: no rank has peers).
  double own_time_max_ratio = 0;
  int64_t own_time_max_rank = -1;  // whose
  double step_time_max_ratio = 0;  // the longest step time over the shortest
  std::vector<StragglerFinding> named;  // every rank slow for `intervals` or more intervals in a row
};

class StragglerJudge {
 public:
  // `threshold` > 1; `intervals` >= 1; `cohorts`: each rank's cohort, by rank (empty: one cohort).
  StragglerJudge(double threshold, int64_t intervals, std::vector<int64_t> cohorts = {});
  // One interval of `steps` steps: `ranks` holds every rank's figures, by rank. Fewer than two
  // ranks: nothing to compare (an empty verdict). `counted` false: the ratios only, the
  // consecutive counts left as they are (for a run's first interval, whose one-time work -
  // allocations, first-touch page faults, lazy initialisation - differs by rank).
  StragglerVerdict judge(const std::vector<RankTimes>& ranks, int64_t steps, bool counted = true);

 private:
  struct Interval {
    std::vector<RankTimes> ranks;
    int64_t steps = 0;
  };
  StragglerFinding finding(int64_t rank) const;
  // The median own time of the ranks of `rank`'s cohort but itself (0 when it has none).
  double others_median(const std::vector<RankTimes>& ranks, size_t rank) const;

  double threshold_;
  int64_t intervals_;
  std::vector<int64_t> cohorts_;
  std::vector<int64_t> slow_in_a_row_;  // per rank
  std::deque<Interval> recent_;         // the last `intervals` intervals
};

// The median of `values` (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

}  // namespace trainer::train
