#pragma once
// Straggler attribution (logging.straggler_threshold, logging.straggler_intervals): at every
// logged step each rank posts its figures of the interval (step time, data wait, forward+backward,
// collective waits in total and by group) in one small all-gather over the world, and every rank
// judges them the same way (straggler_judge.h); rank 0's log prints what it found. Off, with no
// collective at all, on one rank or with logging.straggler_intervals = 0, and on a GPU: there the
// host only enqueues kernels and NCCL's waits do not block it, so host times cannot tell who is
// slow until collectives are timed on the device (trainer.cpp says so at the start).
//
// The watch keeps its own interval, from one all-gather's start to the next (the first from the
// first step's start): the run's start-up, which differs by rank (rank 0 alone prints the
// opening), stays out of it, and the wait in the previous all-gather falls inside it, as its wait
// does in the steps' figures.
#include <c10/core/Device.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "mesh/process_groups.h"
#include "recipe/recipe.h"
#include "train/step_observer.h"
#include "train/straggler_judge.h"

namespace trainer::train {

// What a logged step found (StepEnd::straggler).
struct StragglerReport {
  StragglerVerdict verdict;
  // One line per rank named by this interval: "straggler: rank R (host H, device D): own time
  // 1.42x the others' median over the last N steps (...); the others wait for it in G (...)".
  std::vector<std::string> lines;
};

class StragglerWatch : public StepObserver {
 public:
  // Gathers every rank's host name and device once (a collective every rank makes here, when on).
  StragglerWatch(const recipe::LoggingConfig& logging, const mesh::ProcessGroups& groups, c10::Device device);
  bool on() const { return on_; }
  void before_step(int64_t step) override;
  // Adds the step's figures; at a logged step: the all-gather, the verdict, and StepEnd::straggler
  // pointing at it.
  void after_step(StepEnd& end) override;

 private:
  // This rank's figures of the interval, per step, in the gathered layout.
  std::vector<double> figures() const;
  std::string line(const StragglerFinding& f) const;

  bool on_;
  comm::Communicator& world_;
  c10::Device device_;
  // The group of each slot of RankTimes::group_waits_s, in an order every rank shares (the mesh's
  // group kinds), as this rank's communicator names it; and its name in the line.
  std::vector<std::string> slot_groups_, slot_labels_;
  std::vector<std::string> hosts_, devices_;  // by rank
  std::optional<StragglerJudge> judge_;  // when on
  // The interval so far: its start, its steps and their figures summed.
  std::optional<std::chrono::steady_clock::time_point> start_;
  int64_t steps_ = 0;
  StepTimes times_;
  int64_t judged_ = 0;  // intervals judged so far
  StragglerReport report_;  // the latest
};

}  // namespace trainer::train
