#include "engine/zero/zero3_gathers.h"

#include "model/tensor_storage.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace trainer::engine {


Zero3Gathers::Zero3Gathers(GradBuckets& buckets, model::ParameterSet& set, const Zero3Options& options)
    : buckets_(buckets), set_(set), options_(options) {
  at::NoGradGuard no_grad;
  const auto& all = buckets.buckets();
  const auto& params = set.all();
  slots_.resize(all.size());
  for (size_t b = 0; b < all.size(); ++b) {
    const auto& bucket = all[b];
    if (!bucket.shard_values.defined())
      throw std::logic_error("ZeRO-3 needs buckets that keep their parameters' shard (BucketOptions::per_unit)");
    int64_t unit = -1;
    for (size_t p : bucket.params) {
      if (unit >= 0 && params[p].unit != unit)
        throw std::logic_error(fmt::format("ZeRO-3 bucket {} holds parameters of units {} and {}", b, unit, params[p].unit));
      unit = params[p].unit;
      slots_[b].pinned = slots_[b].pinned || params[p].uses > 1;
    }
    // A one-rank group's bucket is its own shard: always whole, never gathered or released.
    if (bucket.comm->size() == 1) slots_[b].state = State::Whole;
    unit_buckets_[unit].push_back(b);
    auto& units = chunk_units_[bucket.chunk];
    if (std::find(units.begin(), units.end(), unit) == units.end()) units.push_back(unit);
  }
  // A tied embedding is used by the head's unit too: gathering that unit gathers its bucket.
  for (size_t b = 0; b < all.size(); ++b)
    if (slots_[b].pinned && options_.head_unit >= 0 && unit_buckets_.count(options_.head_unit))
      unit_buckets_[options_.head_unit].push_back(b);
  model::UnitHooks hooks;
  hooks.before_forward = [this](int64_t unit) { before_forward(unit); };
  hooks.after_forward = [this](int64_t unit) { after_forward(unit); };
  hooks.before_backward = [this](int64_t unit) { before_backward(unit); };
  set_.set_unit_hooks(std::move(hooks));
}

Zero3Gathers::~Zero3Gathers() {
  set_.set_unit_hooks({});
  for (size_t b = 0; b < slots_.size(); ++b)
    if (slots_[b].work) slots_[b].work->wait();
}

int64_t Zero3Gathers::neighbour(int64_t unit, int direction) const {
  auto it = unit_buckets_.find(unit);
  if (it == unit_buckets_.end()) return -1;
  if (direction > 0) {
    ++it;
    return it == unit_buckets_.end() ? -1 : it->first;
  }
  return it == unit_buckets_.begin() ? -1 : std::prev(it)->first;
}

void Zero3Gathers::gather(int64_t unit) {
  auto it = unit_buckets_.find(unit);
  if (it == unit_buckets_.end()) return;
  at::NoGradGuard no_grad;
  auto& all = buckets_.buckets();
  for (size_t b : it->second) {
    Slot& slot = slots_[b];
    if (slot.state != State::Released) continue;
    auto& bucket = all[b];
    model::allocate_storage(bucket.values);
    slot.work = bucket.comm->all_gather(bucket.values, bucket.shard_values);
    slot.state = State::Gathering;
  }
}

void Zero3Gathers::wait_slot(size_t b) {
  Slot& slot = slots_[b];
  if (slot.state != State::Gathering) return;
  const auto start = std::chrono::steady_clock::now();
  slot.work->wait();
  slot.work.reset();
  slot.state = State::Gathered;
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Zero3Gathers::wait(int64_t unit) {
  auto it = unit_buckets_.find(unit);
  if (it == unit_buckets_.end()) return;
  for (size_t b : it->second) wait_slot(b);
}

void Zero3Gathers::release(int64_t unit) {
  auto it = unit_buckets_.find(unit);
  if (it == unit_buckets_.end()) return;
  for (size_t b : it->second) {
    if (slots_[b].pinned || slots_[b].state == State::Released || slots_[b].state == State::Whole) continue;
    wait_slot(b);  // a prefetch still writing into the buffer
    model::release_storage(buckets_.buckets()[b].values);
    slots_[b].state = State::Released;
  }
}

void Zero3Gathers::release_all() {
  for (size_t b = 0; b < slots_.size(); ++b) {
    if (slots_[b].state == State::Released || slots_[b].state == State::Whole) continue;
    wait_slot(b);
    model::release_storage(buckets_.buckets()[b].values);
    slots_[b].state = State::Released;
  }
}

void Zero3Gathers::before_forward(int64_t unit) {
  gather(unit);
  gather(neighbour(unit, +1));  // prefetched: its gather runs behind this unit's computation
  wait(unit);
}

void Zero3Gathers::after_forward(int64_t unit) {
  const bool training = at::GradMode::is_enabled();
  // The head's backward follows at once; without a backward (evaluation) nothing is kept.
  if (training && (unit == options_.head_unit || !options_.reshard_after_forward)) return;
  release(unit);
}

bool Zero3Gathers::same_chunk(int64_t a, int64_t b) const {
  for (const auto& [chunk, units] : chunk_units_)
    if (std::find(units.begin(), units.end(), a) != units.end())
      return std::find(units.begin(), units.end(), b) != units.end();
  return false;
}

bool Zero3Gathers::releasable_after_backward(int64_t unit) const {
  // The head's deferred weight gradient (zero-bubble's W) computes its logits again.
  return options_.reshard_after_backward && !(unit == options_.head_unit && options_.keep_head);
}

void Zero3Gathers::before_backward(int64_t unit) {
  // The unit after this one (in model order, in its chunk) has finished its backward.
  const int64_t done = neighbour(unit, +1);
  if (done >= 0 && same_chunk(unit, done) && releasable_after_backward(done)) release(done);
  // The embedding's backward does not read its weight: it is not gathered for it.
  if (unit != options_.embedding_unit) gather(unit);
  const int64_t previous = neighbour(unit, -1);
  if (options_.reshard_after_forward && previous != options_.embedding_unit) gather(previous);
  wait(unit);
}

void Zero3Gathers::end_backward(int64_t chunk) {
  auto it = chunk_units_.find(chunk);
  if (it == chunk_units_.end()) return;
  for (int64_t unit : it->second)
    if (releasable_after_backward(unit)) release(unit);
}

double Zero3Gathers::take_wait_s() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace trainer::engine
