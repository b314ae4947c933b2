#include "train/straggler_judge.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace trainer::train {

double RankTimes::own_s() const { return std::max(0.0, step_s - wait_s - data_s); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

StragglerJudge::StragglerJudge(double threshold, int64_t intervals, std::vector<int64_t> cohorts)
    : threshold_(threshold), intervals_(intervals), cohorts_(std::move(cohorts)) {
  if (threshold <= 1 || intervals < 1) throw std::invalid_argument("StragglerJudge: threshold > 1 and intervals >= 1");
}

double StragglerJudge::others_median(const std::vector<RankTimes>& ranks, size_t rank) const {
  const auto cohort = [&](size_t r) { return r < cohorts_.size() ? cohorts_[r] : 0; };
  std::vector<double> others;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (r != rank && cohort(r) == cohort(rank)) others.push_back(ranks[r].own_s());
  return median(others);
}

StragglerVerdict StragglerJudge::judge(const std::vector<RankTimes>& ranks, int64_t steps, bool counted) {
  StragglerVerdict v;
  if (ranks.size() < 2) return v;
  // A different world (never within one run) would mix ranks: start over.
  if (slow_in_a_row_.size() != ranks.size()) slow_in_a_row_.assign(ranks.size(), 0), recent_.clear();
  if (counted) {
    recent_.push_back({ranks, std::max<int64_t>(1, steps)});
    while (int64_t(recent_.size()) > intervals_) recent_.pop_front();
  }

  double step_min = ranks[0].step_s, step_max = ranks[0].step_s;
  for (size_t r = 0; r < ranks.size(); ++r) {
    step_min = std::min(step_min, ranks[r].step_s), step_max = std::max(step_max, ranks[r].step_s);
    const double others = others_median(ranks, r);
    // No peers, or peers with no own time at all (only waiting): nothing to compare against.
    const double ratio = others > 0 ? ranks[r].own_s() / others : 0.0;
    if (ratio > v.own_time_max_ratio) v.own_time_max_ratio = ratio, v.own_time_max_rank = int64_t(r);
    if (counted) slow_in_a_row_[r] = ratio > threshold_ ? slow_in_a_row_[r] + 1 : 0;
  }
  v.step_time_max_ratio = step_min > 0 ? step_max / step_min : 0.0;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (slow_in_a_row_[r] >= intervals_) {
      StragglerFinding f = finding(int64_t(r));
      f.first = slow_in_a_row_[r] == intervals_;
      v.named.push_back(f);
    }
  // The slowest first: the one a single metrics key names.
  std::sort(v.named.begin(), v.named.end(), [](const auto& a, const auto& b) { return a.own_ratio > b.own_ratio; });
  return v;
}

// Summed over the intervals kept (the last `intervals`, all slow for `rank`), weighted by steps.
StragglerFinding StragglerJudge::finding(int64_t rank) const {
  StragglerFinding f;
  f.rank = rank;
  const size_t me = size_t(rank);
  const size_t slots = recent_.back().ranks[me].group_waits_s.size();
  std::vector<double> others_waits(slots, 0.0);
  double own = 0, others_own = 0;
  for (const Interval& interval : recent_) {
    const double w = double(interval.steps);
    const RankTimes& mine = interval.ranks[me];
    f.steps += interval.steps;
    own += w * mine.own_s();
    others_own += w * others_median(interval.ranks, me);
    f.mine.step_s += w * mine.step_s, f.mine.data_s += w * mine.data_s;
    f.mine.compute_s += w * mine.compute_s, f.mine.wait_s += w * mine.wait_s;
    const double others = double(interval.ranks.size() - 1);
    for (size_t r = 0; r < interval.ranks.size(); ++r)
      if (r != me)
        for (size_t s = 0; s < slots && s < interval.ranks[r].group_waits_s.size(); ++s)
          others_waits[s] += w * interval.ranks[r].group_waits_s[s] / others;
  }
  const double steps = double(f.steps);
  f.own_ratio = others_own > 0 ? own / others_own : 0.0;
  f.others_own_s = others_own / steps;
  f.mine.step_s /= steps, f.mine.data_s /= steps, f.mine.compute_s /= steps, f.mine.wait_s /= steps;
  for (size_t s = 0; s < slots; ++s)
    if (others_waits[s] / steps > f.others_wait_s) f.others_wait_s = others_waits[s] / steps, f.others_wait_slot = int64_t(s);
  return f;
}

}  // namespace trainer::train
