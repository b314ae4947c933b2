#include "counting/tensor_timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::counting {

void Costs::add(const Costs& other) {
  gemms.insert(gemms.end(), other.gemms.begin(), other.gemms.end());
  attention_flops += other.attention_flops;
  attention_calls += other.attention_calls;
  memory_bytes += other.memory_bytes;
  memory_kernels += other.memory_kernels;
  comms.insert(comms.end(), other.comms.begin(), other.comms.end());
}

double Costs::gemm_flops() const {
  double total = 0;
  for (const auto& g : gemms) total += g.flops();
  return total;
}

Timeline::Id Timeline::alloc(int64_t bytes) {
  if (bytes < 0) throw std::logic_error(fmt::format("Timeline::alloc({})", bytes));
  if (granularity_ > 1 && bytes > 0) bytes = (bytes + granularity_ - 1) / granularity_ * granularity_;
  tensors_.push_back(Tensor{bytes, 1});
  level_ += bytes;
  peak_ = std::max(peak_, level_);
  segment_peak_ = std::max(segment_peak_, level_);
  return Id(tensors_.size() - 1);
}

void Timeline::hold(Id id) {
  if (id == kNone) return;
  auto& t = tensors_.at(size_t(id));
  if (t.owners <= 0) throw std::logic_error(fmt::format("Timeline::hold of freed tensor {}", id));
  ++t.owners;
}

void Timeline::drop(Id id) {
  if (id == kNone) return;
  auto& t = tensors_.at(size_t(id));
  if (t.owners <= 0) throw std::logic_error(fmt::format("Timeline::drop of freed tensor {}", id));
  if (--t.owners == 0) level_ -= t.bytes;
}

int64_t Timeline::bytes(Id id) const { return tensors_.at(size_t(id)).bytes; }

void Timeline::begin() {
  segment_start_ = level_;
  segment_peak_ = level_;
  costs_ = Costs{};
}

Segment Timeline::end() {
  Segment s;
  s.net = level_ - segment_start_;
  s.peak = segment_peak_ - segment_start_;
  s.costs = std::move(costs_);
  costs_ = Costs{};
  return s;
}

}  // namespace trainer::counting
