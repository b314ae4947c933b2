#pragma once
// Zero-bubble pipelines split a layer's backward into B (the input gradient, needed by the
// previous stage now) and W (the weight gradient, which can wait). While a queue is deferring,
// the custom linear (model/linear_function.h) computes only B in backward and queues W here;
// run_all() computes the queued weight gradients later, in the order they were queued.
#include <cstddef>
#include <deque>
#include <functional>

namespace trainer::model {

class WeightGradQueue {
 public:
  void set_deferring(bool on) { deferring_ = on; }
  bool deferring() const { return deferring_; }
  // Runs `work` now unless deferring, in which case it waits for run_all().
  void submit(std::function<void()> work);
  void run_all();
  // Runs the `count` oldest queued works (zero-bubble's W of one micro-batch).
  void run_oldest(size_t count);
  size_t pending() const { return pending_.size(); }

 private:
  bool deferring_ = false;
  std::deque<std::function<void()>> pending_;
};

}  // namespace trainer::model
