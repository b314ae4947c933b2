#include "train/straggler_watch.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "mesh/rank_layout.h"
#include "train/train_step.h"

namespace trainer::train {

namespace {

using Clock = std::chrono::steady_clock;

// Host names and devices travel once per run as fixed-size rows of character codes, in fp64 like
// the figures (exact for character codes).
constexpr int64_t kHostChars = 64, kDeviceChars = 32;

// The layout of a rank's figures: these, then one wait per group slot.
enum Figure : int64_t { kStep, kData, kCompute, kWait, kFigures };

void put(std::vector<double>& row, const std::string& text, int64_t at, int64_t width) {
  for (int64_t i = 0; i < width - 1 && i < int64_t(text.size()); ++i) row[size_t(at + i)] = double(uint8_t(text[size_t(i)]));
}

std::string take(const double* row, int64_t width) {
  std::string text;
  for (int64_t i = 0; i < width && row[i] > 0; ++i) text.push_back(char(int(row[i])));
  return text;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

StragglerWatch::StragglerWatch(const recipe::LoggingConfig& logging, const mesh::ProcessGroups& groups,
                               c10::Device device)
    : on_(logging.straggler_intervals > 0 && groups.world().size() > 1 && !device.is_cuda()),
      world_(groups.world()),
      device_(device) {
  if (!on_) return;
  // A rank is compared with the ranks of its pipeline stage only (the same layers).
  std::vector<int64_t> stages;
  for (int64_t r = 0; r < world_.size(); ++r) stages.push_back(groups.layout().coordinates(r).pp);
  judge_.emplace(logging.straggler_threshold, logging.straggler_intervals, stages);
  // The mesh's kinds, then the world (last, so that a kind sharing the world's communicator
  // names the wait in the line).
  const auto slot = [&](const comm::Communicator& group, const std::string& kind) {
    slot_groups_.push_back(group.name());
    // A group of one rank on this rank may be a real group on others: its kind names it then.
    slot_labels_.push_back(group.size() > 1 ? group.name() : kind);
  };
  for (mesh::GroupKind kind : mesh::all_group_kinds()) slot(groups.get(kind), mesh::group_kind_name(kind));
  slot(world_, "world");
  std::vector<double> mine(size_t(kHostChars + kDeviceChars), 0.0);
  put(mine, host_name(), 0, kHostChars);
  put(mine, device.str(), kHostChars, kDeviceChars);
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor input = at::tensor(mine, options).to(device);
  at::Tensor output = at::empty({world_.size() * int64_t(mine.size())}, options.device(device));
  world_.all_gather(output, input)->wait();
  const at::Tensor all = output.to(at::kCPU).contiguous();
  for (int64_t r = 0; r < world_.size(); ++r) {
    const double* row = all.data_ptr<double>() + r * int64_t(mine.size());
    hosts_.push_back(take(row, kHostChars));
    devices_.push_back(take(row + kHostChars, kDeviceChars));
  }
}

std::vector<double> StragglerWatch::figures() const {
  const double steps = double(std::max<int64_t>(1, steps_));
  const StepTimes times = times_.scaled(1.0 / steps);
  std::vector<double> row(size_t(kFigures) + slot_groups_.size(), 0.0);
  row[kStep] = std::chrono::duration<double>(Clock::now() - *start_).count() / steps;
  row[kData] = times.data_s;
  row[kCompute] = times.forward_s + times.backward_s;
  // Every wait, those outside the phases too (the stop vote's, the previous interval's gather).
  for (const auto& [group, seconds] : times.comm_wait_by_group_s) row[kWait] += seconds;
  row[kWait] = std::max(row[kWait], times.comm_wait_s);
  for (size_t s = 0; s < slot_groups_.size(); ++s) {
    const auto it = times.comm_wait_by_group_s.find(slot_groups_[s]);
    if (it != times.comm_wait_by_group_s.end()) row[size_t(kFigures) + s] = it->second;
  }
  return row;
}

void StragglerWatch::before_step(int64_t) {
  if (on_ && !start_) start_ = Clock::now();
}

void StragglerWatch::after_step(StepEnd& end) {
  if (!on_) return;
  ++steps_;
  times_ += end.figures.times;
  // Only at logged steps, which every rank reaches together (the reader reads them on every rank).
  if (!end.reading || !end.reading->logged) return;
  const std::vector<double> mine = figures();
  const int64_t steps = steps_;
  start_ = Clock::now();  // the next interval holds this all-gather, as the next step's figures hold its wait
  steps_ = 0;
  times_ = StepTimes{};
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const int64_t width = int64_t(mine.size());
  const at::Tensor input = at::tensor(mine, options).to(device_);
  at::Tensor output = at::empty({world_.size() * width}, options.device(device_));
  world_.all_gather(output, input)->wait();
  const at::Tensor all = output.to(at::kCPU).contiguous();
  std::vector<RankTimes> ranks(size_t(world_.size()));
  for (int64_t r = 0; r < world_.size(); ++r) {
    const double* row = all.data_ptr<double>() + r * width;
    RankTimes& t = ranks[size_t(r)];
    t.step_s = row[kStep], t.data_s = row[kData], t.compute_s = row[kCompute], t.wait_s = row[kWait];
    t.group_waits_s.assign(row + kFigures, row + width);
  }
  // The run's first interval holds one-time work that differs by rank: reported, not counted.
  report_.verdict = judge_->judge(ranks, steps, /*counted=*/judged_ > 0);
  ++judged_;
  report_.lines.clear();
  for (const StragglerFinding& f : report_.verdict.named)
    if (f.first) report_.lines.push_back(line(f));
  end.straggler = &report_;
}

std::string StragglerWatch::line(const StragglerFinding& f) const {
  const size_t r = size_t(f.rank);
  const std::string where =
      f.others_wait_slot >= 0
          ? fmt::format("the others wait for it in {} ({:.3f} s per step)", slot_labels_[size_t(f.others_wait_slot)],
                        f.others_wait_s)
          : std::string("the others wait for it outside the collectives timed by group");
  return fmt::format(
      "straggler: rank {} (host {}, device {}): own time {:.2f}x the others' median over the last {} steps "
      "(forward+backward {:.3f} s, data {:.3f} s, own {:.3f} s per step against the others' {:.3f} s); {}",
      f.rank, hosts_[r], devices_[r], f.own_ratio, f.steps, f.mine.compute_s, f.mine.data_s, f.mine.own_s(),
      f.others_own_s, where);
}

}  // namespace trainer::train
