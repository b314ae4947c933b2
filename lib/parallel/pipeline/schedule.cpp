#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <ostream>
#include <deque>
#include <optional>
#include <stdexcept>

namespace trainer::parallel {

using K = Action::Kind;

bool is_compute(Action::Kind kind) {
  return kind == K::Forward || kind == K::Backward || kind == K::BackwardInput || kind == K::BackwardWeight;
}

std::string to_string(const Action& a) {
  const char* letter = "F";
  switch (a.kind) {
    case K::Forward: letter = "F"; break;
    case K::Backward: letter = "B"; break;
    case K::BackwardInput: letter = "I"; break;
    case K::BackwardWeight: letter = "W"; break;
    case K::SendForward: letter = "sendF"; break;
    case K::RecvForward: letter = "recvF"; break;
    case K::SendBackward: letter = "sendB"; break;
    case K::RecvBackward: letter = "recvB"; break;
  }
  return fmt::format("{}{}c{}", letter, a.micro_batch, a.chunk);
}

std::ostream& operator<<(std::ostream& out, const Action& action) { return out << to_string(action); }

std::string to_string(const std::vector<Action>& actions) {
  std::string text;
  for (const Action& a : actions) text += (text.empty() ? "" : " ") + to_string(a);
  return text;
}

std::vector<Action> single_stage_schedule(int64_t micro_batches) {
  std::vector<Action> actions;
  for (int64_t m = 0; m < micro_batches; ++m) {
    actions.push_back({K::Forward, m, 0});
    actions.push_back({K::Backward, m, 0});
  }
  return actions;
}

namespace {

// The position of one action of each (kind, micro-batch, chunk) in a list, in a dense table: lists
// name small indices, and maps keyed by tuples made the exhaustive tests slow in debug builds.
class Positions {
 public:
  Positions(int64_t micro_batches, int64_t chunks)
      : micro_batches_(micro_batches), chunks_(chunks), slots_(kKinds * micro_batches * chunks, kNone) {}

  // Records position i unless one is recorded; returns false when one was.
  bool add(const Action& a, size_t i) {
    size_t& slot = slots_[index(a.kind, a.micro_batch, a.chunk)];
    if (slot != kNone) return false;
    slot = i;
    return true;
  }

  // The position of (kind, m, c); none for indices outside the table.
  std::optional<size_t> find(K kind, int64_t m, int64_t c) const {
    if (m < 0 || m >= micro_batches_ || c < 0 || c >= chunks_) return std::nullopt;
    const size_t slot = slots_[index(kind, m, c)];
    return slot == kNone ? std::nullopt : std::optional<size_t>(slot);
  }

 private:
  static constexpr int64_t kKinds = 8;
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t index(K kind, int64_t m, int64_t c) const {
    return static_cast<size_t>((static_cast<int64_t>(kind) * micro_batches_ + m) * chunks_ + c);
  }
  int64_t micro_batches_, chunks_;
  std::vector<size_t> slots_;
};

}  // namespace

void check_schedule(const std::vector<Action>& actions, bool forward_only) {
  const auto failure = [](const Action& a, const std::string& why) {
    return std::logic_error(fmt::format("schedule action {}: {}", to_string(a), why));
  };
  int64_t micro_batches = 0, chunks = 0;
  for (const Action& a : actions) {
    if (a.micro_batch < 0 || a.chunk < 0) throw failure(a, "a negative micro-batch or chunk");
    micro_batches = std::max(micro_batches, a.micro_batch + 1);
    chunks = std::max(chunks, a.chunk + 2);  // room to look up chunk c + 1
  }
  if (micro_batches * chunks > (int64_t{1} << 24))  // the tables below are dense
    throw std::logic_error(fmt::format("schedule: indices up to micro-batch {} and chunk {} are too large",
                                       micro_batches - 1, chunks - 2));
  // Pass 1, compute and uniqueness. Per (micro-batch, chunk): 0 nothing yet, 1 forward done, 2 input
  // gradient done, 3 finished.
  std::vector<int> state(micro_batches * chunks, 0);
  Positions position(micro_batches, chunks);  // the first position of each action
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const auto fail = [&](const std::string& why) { throw failure(a, why); };
    if (forward_only && a.kind != K::Forward && a.kind != K::SendForward && a.kind != K::RecvForward)
      fail("a backward action in a forward-only schedule");
    if (!position.add(a, i) && !is_compute(a.kind)) fail("a second send or receive of the same data");
    int& s = state[a.micro_batch * chunks + a.chunk];
    switch (a.kind) {
      case K::Forward:
        if (s != 0) fail("a second forward");
        s = 1;
        break;
      case K::Backward:
        if (s != 1) fail("backward without a forward before it, or twice");
        s = 3;
        break;
      case K::BackwardInput:
        if (s != 1) fail("input gradient without a forward before it, or twice");
        s = 2;
        break;
      case K::BackwardWeight:
        if (s != 2) fail("weight gradient without its input gradient before it, or twice");
        s = 3;
        break;
      case K::SendForward:
        if (s < 1) fail("sends an output before the forward computing it");
        break;
      case K::SendBackward:
        if (s < 2) fail("sends an input gradient before the backward computing it");
        break;
      case K::RecvForward:
      case K::RecvBackward:
        break;
    }
  }
  for (int64_t m = 0; m < micro_batches; ++m)
    for (int64_t c = 0; c < chunks; ++c)
      if (state[m * chunks + c] != (forward_only ? 1 : 3) && position.find(K::Forward, m, c))
        throw std::logic_error(
            fmt::format("schedule: micro-batch {} of chunk {} never finishes its backward", m, c));

  // Pass 2, data: each action's inputs are here before it runs.
  const auto at = [&](K kind, int64_t m, int64_t c) { return position.find(kind, m, c); };
  const auto backward_at = [&](int64_t m, int64_t c) {
    const auto b = at(K::Backward, m, c);
    return b ? b : at(K::BackwardInput, m, c);
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int64_t m = a.micro_batch, c = a.chunk;
    const auto fail = [&](const std::string& why) { throw failure(a, why); };
    const auto before = [&](std::optional<size_t> p) { return p && *p < i; };
    const auto after = [&](std::optional<size_t> p) { return p && *p > i; };
    switch (a.kind) {
      case K::Forward:
        if (c > 0 && !before(at(K::Forward, m, c - 1)) && !before(at(K::RecvForward, m, c - 1)))
          fail(fmt::format("its input (chunk {}'s output) is neither computed here before it nor received", c - 1));
        if (at(K::SendForward, m, c) && at(K::Forward, m, c + 1))
          fail(fmt::format("its output is both sent and used here by chunk {}", c + 1));
        break;
      case K::Backward:
      case K::BackwardInput:
        // The output's gradient: received, from the local next chunk, or none (the output is the loss).
        if (at(K::SendForward, m, c) ? !before(at(K::RecvBackward, m, c + 1))
                                     : at(K::Forward, m, c + 1) && !before(backward_at(m, c + 1)))
          fail(fmt::format("the gradient of its output (from chunk {}) is not here before it", c + 1));
        break;
      case K::RecvForward:
        if (!after(at(K::Forward, m, c + 1)))
          fail(fmt::format("no forward of chunk {} after it uses the data", c + 1));
        break;
      case K::RecvBackward:
        if (c == 0 || !after(backward_at(m, c - 1)))
          fail(fmt::format("no backward of chunk {} after it uses the gradient", c - 1));
        break;
      case K::SendBackward:
        if (c == 0) fail("chunk 0 has no chunk before it to send an input gradient to");
        break;
      case K::BackwardWeight:
      case K::SendForward:
        break;
    }
  }
}

}  // namespace trainer::parallel
