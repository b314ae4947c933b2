#include "train/stop_vote.h"

#include <ATen/ATen.h>

#include "runtime/stop_signal.h"

namespace trainer::train {

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
