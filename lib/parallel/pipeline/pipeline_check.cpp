// The whole-pipeline check: sends matched by receives across stages, dependencies satisfiable (schedule.h).
#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>
#include <optional>
#include <stdexcept>

namespace trainer::parallel {

using K = Action::Kind;
// --- The whole pipeline --------------------------------------------------------------------------

void check_pipeline(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& stages) {
  check_spec(spec);
  const int64_t pp = spec.pp, chunks = spec.pp * spec.vpp, m = spec.micro_batches;
  const bool forward_only = is_forward_only(spec.kind);
  if (static_cast<int64_t>(stages.size()) != pp)
    throw std::logic_error(fmt::format("pipeline: {} action lists for pp={}", stages.size(), pp));
  const std::vector<int64_t> chunk_stage = chunk_stages(spec);
  const auto stage_of = [&](int64_t chunk) { return chunk_stage.at(chunk); };
  const auto fail = [](int64_t stage, const Action& a, const std::string& why) {
    throw std::logic_error(fmt::format("pipeline stage {}, action {}: {}", stage, to_string(a), why));
  };

  // Per stage, then placement and counts. A send and its receive carry the same (kind of data,
  // micro-batch, chunk); data is an activation (forward) or a gradient (backward). Dense tables
  // indexed by (kind, micro-batch, chunk) keep this fast in debug builds.
  const auto data_index = [&](bool backward, int64_t mb, int64_t c) { return ((backward ? m : 0) + mb) * chunks + c; };
  static_assert(static_cast<int>(K::BackwardWeight) == 3, "the compute kinds come first");
  const auto compute_index = [&](K kind, int64_t mb, int64_t c) {
    return (static_cast<int64_t>(kind) * m + mb) * chunks + c;
  };
  std::vector<int64_t> sender(2 * m * chunks, -1), receiver(2 * m * chunks, -1);
  std::vector<int64_t> compute_count(4 * m * chunks, 0);
  for (int64_t s = 0; s < pp; ++s) {
    try {
      check_schedule(stages[s], forward_only);
    } catch (const std::logic_error& e) {
      throw std::logic_error(fmt::format("pipeline stage {}: {}", s, e.what()));
    }
    for (const Action& a : stages[s]) {
      if (a.micro_batch >= m) fail(s, a, fmt::format("micro-batch out of range: the step has {}", m));
      if (a.chunk >= chunks) fail(s, a, fmt::format("chunk out of range: the model has {}", chunks));
      const bool backward = a.kind == K::SendBackward || a.kind == K::RecvBackward;
      switch (a.kind) {
        case K::Forward:
        case K::Backward:
        case K::BackwardInput:
        case K::BackwardWeight:
          if (stage_of(a.chunk) != s) fail(s, a, fmt::format("chunk {} lives on stage {}", a.chunk, stage_of(a.chunk)));
          ++compute_count[compute_index(a.kind, a.micro_batch, a.chunk)];
          break;
        case K::SendForward:
        case K::SendBackward: {
          const int64_t to = backward ? a.chunk - 1 : a.chunk + 1;
          if (stage_of(a.chunk) != s) fail(s, a, fmt::format("chunk {} lives on stage {}", a.chunk, stage_of(a.chunk)));
          if (to < 0 || to >= chunks) fail(s, a, "no chunk to send to");
          if (stage_of(to) == s) fail(s, a, fmt::format("chunk {} is on this stage: no send needed", to));
          int64_t& from = sender[data_index(backward, a.micro_batch, a.chunk)];
          if (from >= 0) fail(s, a, "sent twice");
          from = s;
          break;
        }
        case K::RecvForward:
        case K::RecvBackward: {
          const int64_t to = backward ? a.chunk - 1 : a.chunk + 1;
          if (to < 0 || to >= chunks || stage_of(to) != s)
            fail(s, a, fmt::format("the receiving chunk {} is not on this stage", to));
          if (stage_of(a.chunk) == s) fail(s, a, fmt::format("chunk {} is on this stage: no receive needed", a.chunk));
          int64_t& at = receiver[data_index(backward, a.micro_batch, a.chunk)];
          if (at >= 0) fail(s, a, "received twice");
          at = s;
          break;
        }
      }
    }
  }
  for (int64_t mb = 0; mb < m; ++mb)
    for (int64_t c = 0; c < chunks; ++c) {
      const auto count = [&](K kind) { return compute_count[compute_index(kind, mb, c)]; };
      const Action f{K::Forward, mb, c};
      if (count(K::Forward) != 1) fail(stage_of(c), f, "missing: each (micro-batch, chunk) needs one forward");
      if (!forward_only && count(K::Backward) + count(K::BackwardInput) != 1)
        fail(stage_of(c), f, "its backward is missing");
    }
  for (const bool backward : {false, true})
    for (int64_t mb = 0; mb < m; ++mb)
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t from = sender[data_index(backward, mb, c)], to = receiver[data_index(backward, mb, c)];
        if (from >= 0 && to < 0) fail(from, {backward ? K::SendBackward : K::SendForward, mb, c}, "never received");
        const Action recv{backward ? K::RecvBackward : K::RecvForward, mb, c};
        if (to >= 0 && from < 0) fail(to, recv, "never sent");
        if (to >= 0 && from != stage_of(c)) fail(to, recv, fmt::format("sent by stage {}, not by chunk {}'s", from, c));
      }

  // Order per (sender, receiver, activations or gradients): the receives in the order of the sends.
  const auto peer = [&](const Action& a) {
    return a.kind == K::SendForward ? stage_of(a.chunk + 1) : a.kind == K::SendBackward ? stage_of(a.chunk - 1)
                                                                                         : stage_of(a.chunk);
  };
  const auto channel = [&](int64_t from, int64_t to, bool backward) { return (from * pp + to) * 2 + (backward ? 1 : 0); };
  std::vector<std::deque<Action>> sent(2 * pp * pp);
  for (int64_t s = 0; s < pp; ++s)
    for (const Action& a : stages[s])
      if (a.kind == K::SendForward || a.kind == K::SendBackward)
        sent[channel(s, peer(a), a.kind == K::SendBackward)].push_back(a);
  for (int64_t s = 0; s < pp; ++s)
    for (const Action& a : stages[s]) {
      if (a.kind != K::RecvForward && a.kind != K::RecvBackward) continue;
      auto& queue = sent[channel(peer(a), s, a.kind == K::RecvBackward)];
      const K send_kind = a.kind == K::RecvForward ? K::SendForward : K::SendBackward;
      if (queue.empty() || !(queue.front() == Action{send_kind, a.micro_batch, a.chunk}))
        fail(s, a, fmt::format("stage {} sends {} to this stage first", peer(a),
                               queue.empty() ? "nothing" : to_string(queue.front())));
      queue.pop_front();
    }

  // Run in order: each stage advances until a receive whose send has not run yet; sends never wait.
  std::vector<size_t> next(pp, 0);
  std::vector<char> posted(2 * m * chunks, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < pp; ++s)
      for (; next[s] < stages[s].size(); ++next[s], progress = true) {
        const Action& a = stages[s][next[s]];
        if (a.kind == K::SendForward || a.kind == K::SendBackward)
          posted[data_index(a.kind == K::SendBackward, a.micro_batch, a.chunk)] = 1;
        if ((a.kind == K::RecvForward || a.kind == K::RecvBackward) &&
            !posted[data_index(a.kind == K::RecvBackward, a.micro_batch, a.chunk)])
          break;
      }
  }
  std::string stuck;
  for (int64_t s = 0; s < pp; ++s)
    if (next[s] < stages[s].size()) stuck += fmt::format("; stage {} waits at {}", s, to_string(stages[s][next[s]]));
  if (!stuck.empty()) throw std::logic_error("pipeline deadlock" + stuck);
}

bool in_order_per_stage_pair(const ScheduleSpec& spec) {
  const auto stages = pipeline_schedule(spec);
  // (from, to) -> the messages in the order the sender posts them, and the order the receiver does.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::tuple<bool, int64_t, int64_t>>> sent, received;
  for (int64_t s = 0; s < int64_t(stages.size()); ++s)
    for (const Action& a : stages[size_t(s)]) {
      const bool gradient = a.kind == K::SendBackward || a.kind == K::RecvBackward;
      if (a.kind == K::SendForward || a.kind == K::SendBackward)
        sent[{s, peer_stage(spec, a)}].emplace_back(gradient, a.micro_batch, a.chunk);
      else if (a.kind == K::RecvForward || a.kind == K::RecvBackward)
        received[{peer_stage(spec, a), s}].emplace_back(gradient, a.micro_batch, a.chunk);
    }
  return sent == received;
}

}  // namespace trainer::parallel
