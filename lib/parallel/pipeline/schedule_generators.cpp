// Schedule kinds, chunk layouts and the per-stage action lists of each schedule (schedule.h).
#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <stdexcept>

namespace trainer::parallel {

using K = Action::Kind;
// --- Kinds and layouts ---------------------------------------------------------------------------

const std::vector<ScheduleKind>& all_schedule_kinds() {
  static const std::vector<ScheduleKind> kinds = [] {
    std::vector<ScheduleKind> all;
    for (const auto& [kind, name] : enum_entries(ScheduleKind{})) all.push_back(kind);
    return all;
  }();
  return kinds;
}

std::string schedule_name(ScheduleKind kind) { return std::string(recipe::name_of(kind)); }

ScheduleKind parse_schedule_kind(const std::string& name) {
  std::string known;
  for (ScheduleKind kind : all_schedule_kinds()) {
    if (schedule_name(kind) == name) return kind;
    known += (known.empty() ? "" : ", ") + schedule_name(kind);
  }
  throw std::invalid_argument(fmt::format("unknown pipeline schedule \"{}\"; expected one of {}", name, known));
}

void check_layout(ScheduleKind kind, int64_t pp, int64_t vpp) {
  const auto name = [kind] { return schedule_name(kind); };
  if (pp < 1) throw std::invalid_argument(fmt::format("pipeline schedule {}: pp must be >= 1, found {}", name(), pp));
  switch (kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
    case ScheduleKind::ZeroBubble:
      if (vpp != 1)
        throw std::invalid_argument(fmt::format(
            "pipeline schedule {} holds one model chunk per stage: vpp must be 1, found {}; use "
            "interleaved_1f1b for vpp > 1",
            name(), vpp));
      break;
    case ScheduleKind::Interleaved1F1B:
      if (vpp < 2)
        throw std::invalid_argument(fmt::format(
            "pipeline schedule interleaved_1f1b needs vpp >= 2 model chunks per stage, found {}; use 1f1b for vpp = 1",
            vpp));
      break;
    case ScheduleKind::ZBV:
    case ScheduleKind::ForwardOnlyV:
      if (vpp != 2)
        throw std::invalid_argument(fmt::format(
            "pipeline schedule {} places exactly 2 model chunks per stage (a V): vpp must be 2, found {}", name(), vpp));
      break;
    case ScheduleKind::ForwardOnly:
      if (vpp < 1)
        throw std::invalid_argument(fmt::format("pipeline schedule forward_only: vpp must be >= 1, found {}", vpp));
      break;
  }
}

ChunkPlace place_chunk(ScheduleKind kind, int64_t pp, int64_t vpp, int64_t model_chunk) {
  check_layout(kind, pp, vpp);
  if (model_chunk < 0 || model_chunk >= pp * vpp)
    throw std::invalid_argument(
        fmt::format("model chunk {} out of range: pp={} vpp={} make {} chunks", model_chunk, pp, vpp, pp * vpp));
  if (v_layout(kind))
    return model_chunk < pp ? ChunkPlace{model_chunk, 0} : ChunkPlace{2 * pp - 1 - model_chunk, 1};
  return {model_chunk % pp, model_chunk / pp};
}

int64_t model_chunk_at(ScheduleKind kind, int64_t pp, int64_t vpp, int64_t stage, int64_t local_chunk) {
  check_layout(kind, pp, vpp);
  if (stage < 0 || stage >= pp || local_chunk < 0 || local_chunk >= vpp)
    throw std::invalid_argument(fmt::format("stage {} local chunk {} out of range: pp={} vpp={}", stage, local_chunk,
                                            pp, vpp));
  if (v_layout(kind)) return local_chunk == 0 ? stage : 2 * pp - 1 - stage;
  return local_chunk * pp + stage;
}

int64_t first_chunk_stage(ScheduleKind kind, int64_t pp, int64_t vpp) { return place_chunk(kind, pp, vpp, 0).stage; }

int64_t last_chunk_stage(ScheduleKind kind, int64_t pp, int64_t vpp) {
  return place_chunk(kind, pp, vpp, pp * vpp - 1).stage;
}

void check_spec(const ScheduleSpec& spec) {
  check_layout(spec.kind, spec.pp, spec.vpp);
  if (spec.micro_batches < 1)
    throw std::invalid_argument(fmt::format("pipeline schedule {}: micro-batches must be >= 1, found {}",
                                            schedule_name(spec.kind), spec.micro_batches));
  if (spec.kind == ScheduleKind::Interleaved1F1B && spec.micro_batches < spec.pp)
    throw std::invalid_argument(fmt::format(
        "pipeline schedule interleaved_1f1b needs micro-batches >= pp (groups of pp micro-batches go through each "
        "chunk in turn), found {} micro-batches for pp={}",
        spec.micro_batches, spec.pp));
}

// --- Generators ----------------------------------------------------------------------------------

std::vector<int64_t> chunk_stages(const ScheduleSpec& spec) {
  std::vector<int64_t> stages;
  for (int64_t c = 0; c < spec.pp * spec.vpp; ++c) stages.push_back(place_chunk(spec.kind, spec.pp, spec.vpp, c).stage);
  return stages;
}

namespace {

// Compute actions only; add_communication inserts the sends and receives.

std::vector<Action> gpipe(const ScheduleSpec& spec, int64_t stage) {
  std::vector<Action> out;
  for (int64_t m = 0; m < spec.micro_batches; ++m) out.push_back({K::Forward, m, stage});
  for (int64_t m = 0; m < spec.micro_batches; ++m) out.push_back({K::Backward, m, stage});
  return out;
}

// 1F1B, and with `split` ZB-H1 (the order of PyTorch's ZB1P with one chunk per stage): the same
// forwards and input-gradient backwards, so the same activations in flight. Stage s defers its first
// s weight-gradient passes: its input gradients reach the stages before it sooner, and the deferred
// passes fill the end of the step, where 1F1B's stage s idles (2s units when F = B = W).
std::vector<Action> one_f_one_b(const ScheduleSpec& spec, int64_t stage, bool split) {
  const int64_t m = spec.micro_batches;
  const int64_t warmup = std::min(spec.pp - stage - 1, m);
  std::vector<Action> out;
  int64_t forwards = 0, backwards = 0, weights = 0;
  while (forwards < warmup) out.push_back({K::Forward, forwards++, stage});
  while (backwards < m) {
    if (forwards < m) out.push_back({K::Forward, forwards++, stage});
    out.push_back({split ? K::BackwardInput : K::Backward, backwards++, stage});
    if (split && backwards > stage) out.push_back({K::BackwardWeight, weights++, stage});
  }
  while (split && weights < m) out.push_back({K::BackwardWeight, weights++, stage});
  return out;
}

// Megatron's order of (micro-batch, local chunk) pairs: groups of pp micro-batches, each group
// through local chunk 0, then 1, ... (get_schedule_table in Megatron-LM's schedules.py). A remainder
// of fewer than pp micro-batches joins the last group: a group smaller than pp would leave stage 0
// waiting for its own first chunk's outputs to come round the pipeline (Megatron refuses such
// counts; merging accepts every count from pp on). `group_size[k]` is the size of entry k's group.
struct InterleavedOrder {
  std::vector<std::pair<int64_t, int64_t>> entries;  // (micro-batch, local chunk)
  std::vector<int64_t> group_size;
};

InterleavedOrder interleaved_order(int64_t micro_batches, int64_t vpp, int64_t pp) {
  InterleavedOrder order;
  for (int64_t first = 0, end = 0; first < micro_batches; first = end) {
    end = micro_batches - first < 2 * pp ? micro_batches : first + pp;
    for (int64_t local = 0; local < vpp; ++local)
      for (int64_t m = first; m < end; ++m) {
        order.entries.push_back({m, local});
        order.group_size.push_back(end - first);
      }
  }
  return order;
}

// Interleaved 1F1B (Narayanan et al. 2021): the k-th forward runs entry k of the order; the k-th
// backward runs entry k's micro-batch on the mirrored local chunk (vpp - 1 - local), so a group's
// backwards go through the chunks from the last. Before backward k, stage s has run
// 2 (pp - s - 1) + (vpp - 1) G + k + 1 forwards (G: the size of k's group; capped at all of them):
// the group through every chunk but the last, one forward per step of the round trip to the last
// stage and back, and one per backward so far. With groups of pp this is Megatron's warm-up of
// 2 (pp - s - 1) + (vpp - 1) pp forwards followed by one forward, one backward; a larger last group
// adds its extra forwards when the backwards reach it.
std::vector<Action> interleaved(const ScheduleSpec& spec, int64_t stage) {
  const int64_t pp = spec.pp, vpp = spec.vpp;
  const InterleavedOrder order = interleaved_order(spec.micro_batches, vpp, pp);
  const int64_t total = static_cast<int64_t>(order.entries.size());
  std::vector<Action> out;
  int64_t forwards = 0;
  for (int64_t k = 0; k < total; ++k) {
    const int64_t before = std::min(total, 2 * (pp - stage - 1) + (vpp - 1) * order.group_size[k] + k + 1);
    for (; forwards < before; ++forwards) {
      const auto [m, local] = order.entries[forwards];
      out.push_back({K::Forward, m, local * pp + stage});
    }
    const auto [m, local] = order.entries[k];
    out.push_back({K::Backward, m, (vpp - 1 - local) * pp + stage});
  }
  return out;
}

// ZB-V (Qi et al. 2023, section 6; the handcrafted order of PyTorch's ScheduleZBVZeroBubble). Stage s
// holds model chunk s (here "chunk 0") and 2pp-1-s ("chunk 1"); B is the input-gradient pass. The
// order: warm-up 2(pp-s)-1 forwards of chunk 0, then s pairs (F1, F0), then pp-s triples
// (F1 B1 W1) on the far side of the V; the steady state runs F0 B0 W0 F1 B1 W1 per micro-batch; the
// cool-down runs the remaining input-gradient passes, and the held-back weight passes fill the gaps. The
// order is built for max(m, 2pp-1) micro-batches and the ones beyond m dropped, which keeps it
// deadlock-free (a subsequence of a runnable order waits on nothing new).
std::vector<Action> zbv(const ScheduleSpec& spec, int64_t stage) {
  const int64_t pp = spec.pp;
  const int64_t n = std::max(spec.micro_batches, 2 * pp - 1);
  const int64_t c0 = stage, c1 = 2 * pp - 1 - stage;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0, w0 = 0, w1 = 0;
  std::vector<Action> out;
  const auto add = [&](K kind, int64_t& counter, int64_t chunk) { out.push_back({kind, counter++, chunk}); };
  for (int64_t i = 0; i < 2 * (pp - stage) - 1; ++i) add(K::Forward, f0, c0);
  for (int64_t i = 0; i < stage; ++i) {
    add(K::Forward, f1, c1);
    add(K::Forward, f0, c0);
  }
  for (int64_t i = 0; i < pp - stage; ++i) {
    add(K::Forward, f1, c1);
    add(K::BackwardInput, b1, c1);
    add(K::BackwardWeight, w1, c1);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) add(K::Forward, f0, c0);
    add(K::BackwardInput, b0, c0);
    add(K::BackwardWeight, w0, c0);
    add(K::Forward, f1, c1);
    add(K::BackwardInput, b1, c1);
    add(K::BackwardWeight, w1, c1);
  }
  for (int64_t i = 0; i < stage; ++i) {
    add(K::BackwardInput, b0, c0);
    add(K::BackwardInput, b1, c1);
  }
  for (int64_t i = 0; i < pp - stage; ++i) {
    add(K::BackwardInput, b0, c0);
    add(K::BackwardWeight, w0, c0);
  }
  while (w1 < b1) add(K::BackwardWeight, w1, c1);
  while (w0 < b0) add(K::BackwardWeight, w0, c0);
  if (f0 != n || f1 != n || b0 != n || b1 != n || w0 != n || w1 != n)
    throw std::logic_error(fmt::format("zbv order for stage {} of pp={} is incomplete", stage, pp));
  std::erase_if(out, [&](const Action& a) { return a.micro_batch >= spec.micro_batches; });
  return out;
}

std::vector<Action> forward_only(const ScheduleSpec& spec, int64_t stage) {
  std::vector<Action> out;
  for (const auto& [m, local] : interleaved_order(spec.micro_batches, spec.vpp, spec.pp).entries)
    out.push_back({K::Forward, m, local * spec.pp + stage});
  return out;
}

std::vector<Action> forward_only_v(const ScheduleSpec& spec, int64_t stage) {
  const int64_t down = stage, up = 2 * spec.pp - 1 - stage;  // local chunks 0 and 1
  std::vector<Action> out;
  for (int64_t m = 0; m < spec.micro_batches; ++m) {
    out.push_back({K::Forward, m, down});
    out.push_back({K::Forward, m, up});
  }
  // Forward (m, c) can start no earlier than m + c; every dependency raises that key, so one
  // global order (key, then chunk) serves all stages.
  std::stable_sort(out.begin(), out.end(), [](const Action& a, const Action& b) {
    return std::pair{a.micro_batch + a.chunk, a.chunk} < std::pair{b.micro_batch + b.chunk, b.chunk};
  });
  return out;
}

// Inserts the receive before and the send after each compute action whose neighbouring chunk lives
// on another stage.
std::vector<Action> add_communication(const ScheduleSpec& spec, int64_t stage, const std::vector<Action>& compute) {
  const std::vector<int64_t> stage_of = chunk_stages(spec);
  const auto remote = [&](int64_t chunk) {
    return chunk >= 0 && chunk < static_cast<int64_t>(stage_of.size()) && stage_of[chunk] != stage;
  };
  std::vector<Action> out;
  for (const Action& a : compute) {
    const int64_t m = a.micro_batch, c = a.chunk;
    if (a.kind == K::Forward) {
      if (remote(c - 1)) out.push_back({K::RecvForward, m, c - 1});
      out.push_back(a);
      if (remote(c + 1)) out.push_back({K::SendForward, m, c});
    } else if (a.kind == K::Backward || a.kind == K::BackwardInput) {
      if (remote(c + 1)) out.push_back({K::RecvBackward, m, c + 1});
      out.push_back(a);
      if (remote(c - 1)) out.push_back({K::SendBackward, m, c});
    } else {
      out.push_back(a);
    }
  }
  return out;
}

}  // namespace

std::vector<Action> stage_schedule(const ScheduleSpec& spec, int64_t stage) {
  check_spec(spec);
  if (stage < 0 || stage >= spec.pp)
    throw std::invalid_argument(fmt::format("pipeline stage {} out of range: pp={}", stage, spec.pp));
  std::vector<Action> compute;
  switch (spec.kind) {
    case ScheduleKind::GPipe: compute = gpipe(spec, stage); break;
    case ScheduleKind::OneFOneB: compute = one_f_one_b(spec, stage, false); break;
    case ScheduleKind::ZeroBubble: compute = one_f_one_b(spec, stage, true); break;
    case ScheduleKind::Interleaved1F1B: compute = interleaved(spec, stage); break;
    case ScheduleKind::ZBV: compute = zbv(spec, stage); break;
    case ScheduleKind::ForwardOnly: compute = forward_only(spec, stage); break;
    case ScheduleKind::ForwardOnlyV: compute = forward_only_v(spec, stage); break;
  }
  return add_communication(spec, stage, compute);
}

std::vector<std::vector<Action>> pipeline_schedule(const ScheduleSpec& spec) {
  check_spec(spec);
  std::vector<std::vector<Action>> stages;
  for (int64_t s = 0; s < spec.pp; ++s) stages.push_back(stage_schedule(spec, s));
  return stages;
}

int64_t peer_stage(const ScheduleSpec& spec, const Action& a) {
  const auto stage_of = [&](int64_t chunk) { return place_chunk(spec.kind, spec.pp, spec.vpp, chunk).stage; };
  switch (a.kind) {
    case K::SendForward: return stage_of(a.chunk + 1);  // to the consumer of chunk c's output
    case K::RecvForward: return stage_of(a.chunk);      // from the producer, chunk c
    case K::SendBackward: return stage_of(a.chunk - 1);
    case K::RecvBackward: return stage_of(a.chunk);
    default: break;
  }
  throw std::invalid_argument(fmt::format("peer_stage: {} is not a send or receive", to_string(a)));
}

}  // namespace trainer::parallel
