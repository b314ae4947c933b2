#include "train/stop_vote.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "runtime/stop_signal.h"

namespace trainer::train {

StopVote::StopVote(comm::Communicator& world, c10::Device device, int64_t first_step, int64_t total_steps)
    : world_(world), device_(device), total_steps_(total_steps) {
  publish(first_step);
}

void StopVote::publish(int64_t step) const {
  runtime::StopSignal::set_stop_step(std::min(step + 2, total_steps_));
}

void StopVote::after_step(StepEnd& end) {
  end.stopping = poll();
  publish(end.step);
}

StopVote::~StopVote() {
  try {
    if (work_) work_->wait();  // never leave a collective behind
  } catch (...) {
  }
}

bool StopVote::poll() {
  bool stop = false;
  if (work_) {
    work_->wait();
    stop = posted_.item<double>() > 0;
  }
  posted_ = at::full({1}, runtime::StopSignal::requested() ? 1.0 : 0.0, at::TensorOptions().dtype(at::kDouble).device(device_));
  work_ = world_.all_reduce(posted_, comm::ReduceOp::Max);
  return stop;
}

}  // namespace trainer::train
