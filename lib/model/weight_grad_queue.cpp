#include "model/weight_grad_queue.h"

#include <ATen/core/grad_mode.h>

namespace trainer::model {

void WeightGradQueue::submit(std::function<void()> work) {
  if (deferring_)
    pending_.push_back(std::move(work));
  else
    work();
}

void WeightGradQueue::run_all() { run_oldest(pending_.size()); }

void WeightGradQueue::run_oldest(size_t count) {
  at::NoGradGuard no_grad;
  for (; count > 0 && !pending_.empty(); --count) {
    std::function<void()> work = std::move(pending_.front());
    pending_.pop_front();
    work();
  }
}

}  // namespace trainer::model
