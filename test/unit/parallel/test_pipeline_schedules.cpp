// Pipeline schedules as data, tested without processes (DESIGN.md invariant 6): every schedule for
// every supported size passes the per-stage and whole-pipeline checks and simulates to the end;
// the simulated timelines respect every dependency; bubble and peak in-flight activations equal the
// closed forms where those hold; small cases equal hand-written lists; bad sizes are refused with
// the rule named; deadlocks are reported, never looped on.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/schedule_chart.h"
#include "parallel/pipeline/simulate.h"

using namespace trainer::parallel;
using K = Action::Kind;
using SK = ScheduleKind;

namespace {

// The sizes a kind takes, from the rules written out here (not from check_spec): pp 1..8,
// micro-batches 1..32; vpp 1 for gpipe, 1f1b and zero_bubble, 2..4 for interleaved (which needs
// m >= pp), 2 for zbv and forward_only_v, 1..4 for forward_only.
bool supported(SK kind, int64_t pp, int64_t vpp, int64_t m) {
  switch (kind) {
    case SK::GPipe:
    case SK::OneFOneB:
    case SK::ZeroBubble: return vpp == 1;
    case SK::Interleaved1F1B: return vpp >= 2 && m >= pp;
    case SK::ZBV:
    case SK::ForwardOnlyV: return vpp == 2;
    case SK::ForwardOnly: return true;
  }
  return false;
}

std::vector<ScheduleSpec> all_specs(SK kind) {
  std::vector<ScheduleSpec> specs;
  for (int64_t pp = 1; pp <= 8; ++pp)
    for (int64_t vpp = 1; vpp <= 4; ++vpp)
      for (int64_t m = 1; m <= 32; ++m)
        if (supported(kind, pp, vpp, m)) specs.push_back({kind, pp, vpp, m});
  return specs;
}

std::string describe(const ScheduleSpec& s) {
  return schedule_name(s.kind) + " pp=" + std::to_string(s.pp) + " vpp=" + std::to_string(s.vpp) +
         " m=" + std::to_string(s.micro_batches);
}

SimulationCosts costs(double f, double b, double w, double latency = 0) {
  SimulationCosts c;
  c.chunk = {f, b, w};
  c.latency = latency;
  return c;
}

// Checks a simulated timeline against the dependencies, independently of the simulator: every
// (micro-batch, chunk) has one forward and one backward (B, or I and W) on the stage holding the
// chunk, lasting its cost; no stage runs two actions at once; a forward starts after the previous
// chunk's forward ended (plus the latency when it came from another stage), a backward after its
// forward and after the next chunk's backward (same latency rule), W after its I. Returns the
// number of problems, each reported through FAIL_CHECK.
int check_timeline(const ScheduleSpec& spec, const Simulation& sim, const SimulationCosts& c) {
  int problems = 0;
  const auto problem = [&](const std::string& what) {
    FAIL_CHECK(describe(spec) << ": " << what);
    ++problems;
  };
  const int64_t chunks = spec.pp * spec.vpp;
  std::vector<int64_t> stage_of;
  for (int64_t ch = 0; ch < chunks; ++ch) stage_of.push_back(place_chunk(spec.kind, spec.pp, spec.vpp, ch).stage);
  // Per (pass, micro-batch, chunk), pass 0 forward, 1 backward (B or I), 2 W: where and when it ran.
  struct Run {
    int64_t stage = -1;
    double start = 0, end = 0;
  };
  std::vector<Run> runs(3 * spec.micro_batches * chunks);
  const auto run = [&](int pass, int64_t m, int64_t ch) -> Run& { return runs[(pass * spec.micro_batches + m) * chunks + ch]; };
  double last_end = 0;
  for (size_t s = 0; s < sim.stages.size(); ++s) {
    double free_at = 0;
    for (const TimedAction& a : sim.stages[s].compute) {
      const K kind = a.action.kind;
      if (a.start < free_at - 1e-9) problem("stage " + std::to_string(s) + " overlaps at " + to_string(a.action));
      free_at = a.end;
      last_end = std::max(last_end, a.end);
      const double cost = kind == K::Forward          ? c.chunk.forward
                          : kind == K::Backward       ? c.chunk.backward_input + c.chunk.backward_weight
                          : kind == K::BackwardInput  ? c.chunk.backward_input
                                                      : c.chunk.backward_weight;
      if (std::abs(a.end - a.start - cost) > 1e-9) problem(to_string(a.action) + " lasts the wrong time");
      Run& r = run(kind == K::Forward ? 0 : kind == K::BackwardWeight ? 2 : 1, a.action.micro_batch, a.action.chunk);
      if (r.stage >= 0) problem("a second " + to_string(a.action));
      r = {static_cast<int64_t>(s), a.start, a.end};
    }
  }
  const bool forward_only = is_forward_only(spec.kind);
  const bool split = splits_backward(spec.kind);
  for (int64_t m = 0; m < spec.micro_batches; ++m)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const std::string name = "micro-batch " + std::to_string(m) + " chunk " + std::to_string(ch);
      const auto lag = [&](int64_t other) { return stage_of[other] == stage_of[ch] ? 0.0 : c.latency; };
      const Run& f = run(0, m, ch);
      if (f.stage != stage_of[ch]) problem(name + ": no forward on its stage");
      if (ch > 0 && f.start < run(0, m, ch - 1).end + lag(ch - 1) - 1e-9) problem(name + ": forward before its input");
      const Run& b = run(1, m, ch);
      const Run& w = run(2, m, ch);
      if (forward_only) {
        if (b.stage >= 0 || w.stage >= 0) problem(name + ": a backward in forward_only");
        continue;
      }
      if (b.stage != stage_of[ch]) problem(name + ": no backward on its stage");
      if (b.start < f.end - 1e-9) problem(name + ": backward before forward");
      if (ch + 1 < chunks && b.start < run(1, m, ch + 1).end + lag(ch + 1) - 1e-9)
        problem(name + ": backward before its output gradient");
      if (split != (w.stage == stage_of[ch])) problem(name + ": weight gradient pass missing or unexpected");
      if (split && w.start < b.end - 1e-9) problem(name + ": W before its I");
    }
  if (std::abs(last_end - sim.makespan) > 1e-9) problem("makespan is not the last end");
  for (const StageTimeline& t : sim.stages)
    if (std::abs(t.idle - (sim.makespan - t.busy)) > 1e-9) problem("idle is not makespan - busy");
  return problems;
}

int64_t forwards_before_first_backward(const std::vector<Action>& actions) {
  int64_t n = 0;
  for (const Action& a : actions) {
    if (a.kind == K::Backward || a.kind == K::BackwardInput) break;
    n += a.kind == K::Forward;
  }
  return n;
}

std::vector<Action> compute_only(const std::vector<Action>& actions) {
  std::vector<Action> out;
  std::copy_if(actions.begin(), actions.end(), std::back_inserter(out), [](const Action& a) { return is_compute(a.kind); });
  return out;
}

}  // namespace

TEST_CASE("schedule names parse and print back", "[parallel][pipeline]") {
  REQUIRE(all_schedule_kinds().size() == 7);
  for (SK kind : all_schedule_kinds()) CHECK(parse_schedule_kind(schedule_name(kind)) == kind);
  CHECK(schedule_name(SK::Interleaved1F1B) == "interleaved_1f1b");
  CHECK(schedule_name(SK::ZeroBubble) == "zero_bubble");
  CHECK_THROWS_AS(parse_schedule_kind("zb-h1"), std::invalid_argument);
  CHECK_THROWS_WITH(parse_schedule_kind("zb-h1"), Catch::Contains("zb-h1") && Catch::Contains("gpipe, 1f1b"));
  CHECK(splits_backward(SK::ZeroBubble));
  CHECK(splits_backward(SK::ZBV));
  CHECK_FALSE(splits_backward(SK::OneFOneB));
}

TEST_CASE("model chunks are placed looped or in a V and map back", "[parallel][pipeline]") {
  for (SK kind : all_schedule_kinds())
    for (int64_t pp = 1; pp <= 8; ++pp)
      for (int64_t vpp = 1; vpp <= 4; ++vpp) {
        if (!supported(kind, pp, vpp, 32)) continue;
        for (int64_t c = 0; c < pp * vpp; ++c) {
          const ChunkPlace place = place_chunk(kind, pp, vpp, c);
          CHECK(model_chunk_at(kind, pp, vpp, place.stage, place.local_chunk) == c);
          if (kind == SK::ZBV || kind == SK::ForwardOnlyV)  // down the V on local chunk 0, back up on local chunk 1
            CHECK(place == (c < pp ? ChunkPlace{c, 0} : ChunkPlace{2 * pp - 1 - c, 1}));
          else  // Megatron: model chunk c * pp + s is local chunk c of stage s
            CHECK(place == ChunkPlace{c % pp, c / pp});
        }
        CHECK(first_chunk_stage(kind, pp, vpp) == 0);
        CHECK(last_chunk_stage(kind, pp, vpp) == (kind == SK::ZBV || kind == SK::ForwardOnlyV ? 0 : pp - 1));
      }
  // ZB-V at pp = 4: stage 0 holds the first and the last chunk, stage 3 the middle two.
  CHECK(model_chunk_at(SK::ZBV, 4, 2, 0, 1) == 7);
  CHECK(model_chunk_at(SK::ZBV, 4, 2, 3, 0) == 3);
  CHECK(model_chunk_at(SK::ZBV, 4, 2, 3, 1) == 4);
  CHECK(model_chunk_at(SK::Interleaved1F1B, 4, 3, 1, 2) == 9);
  CHECK_THROWS_AS(place_chunk(SK::OneFOneB, 4, 1, 4), std::invalid_argument);
  CHECK_THROWS_AS(model_chunk_at(SK::ZBV, 4, 2, 4, 0), std::invalid_argument);
}

TEST_CASE("unsupported sizes are refused naming the rule", "[parallel][pipeline]") {
  // Exactly the sizes outside the rules are refused, over the whole tested range.
  for (SK kind : all_schedule_kinds())
    for (int64_t pp = 1; pp <= 8; ++pp)
      for (int64_t vpp = 1; vpp <= 4; ++vpp)
        for (int64_t m = 1; m <= 32; ++m) {
          const ScheduleSpec spec{kind, pp, vpp, m};
          if (supported(kind, pp, vpp, m))
            CHECK_NOTHROW(check_spec(spec));
          else
            CHECK_THROWS_AS(check_spec(spec), std::invalid_argument);
        }
  CHECK_THROWS_WITH(stage_schedule({SK::GPipe, 2, 2, 4}, 0), Catch::Contains("vpp must be 1"));
  CHECK_THROWS_WITH(stage_schedule({SK::ZeroBubble, 2, 3, 4}, 0), Catch::Contains("vpp must be 1"));
  CHECK_THROWS_WITH(stage_schedule({SK::Interleaved1F1B, 4, 1, 8}, 0), Catch::Contains("vpp >= 2"));
  CHECK_THROWS_WITH(stage_schedule({SK::Interleaved1F1B, 4, 2, 3}, 0), Catch::Contains("micro-batches >= pp"));
  CHECK_THROWS_WITH(stage_schedule({SK::ZBV, 4, 1, 8}, 0), Catch::Contains("vpp must be 2"));
  CHECK_THROWS_WITH(stage_schedule({SK::ZBV, 4, 3, 8}, 0), Catch::Contains("vpp must be 2"));
  CHECK_THROWS_WITH(stage_schedule({SK::ForwardOnlyV, 4, 1, 8}, 0), Catch::Contains("vpp must be 2"));
  CHECK_THROWS_WITH(stage_schedule({SK::OneFOneB, 0, 1, 8}, 0), Catch::Contains("pp must be >= 1"));
  CHECK_THROWS_WITH(stage_schedule({SK::OneFOneB, 2, 1, 0}, 0), Catch::Contains("micro-batches must be >= 1"));
  CHECK_THROWS_WITH(stage_schedule({SK::OneFOneB, 2, 1, 4}, 2), Catch::Contains("stage 2 out of range"));
}

TEST_CASE("one stage gives the plain gradient-accumulation lists", "[parallel][pipeline]") {
  CHECK(stage_schedule({SK::OneFOneB, 1, 1, 3}, 0) == single_stage_schedule(3));
  CHECK(to_string(stage_schedule({SK::GPipe, 1, 1, 3}, 0)) == "F0c0 F1c0 F2c0 B0c0 B1c0 B2c0");
  CHECK(to_string(stage_schedule({SK::ZeroBubble, 1, 1, 2}, 0)) == "F0c0 I0c0 W0c0 F1c0 I1c0 W1c0");
  CHECK(to_string(stage_schedule({SK::ForwardOnly, 1, 1, 3}, 0)) == "F0c0 F1c0 F2c0");
  // Two chunks on one stage hand over locally: chunk 1 runs right after chunk 0, its backward first.
  CHECK(to_string(stage_schedule({SK::ZBV, 1, 2, 2}, 0)) ==
        "F0c0 F0c1 I0c1 W0c1 F1c0 I0c0 W0c0 F1c1 I1c1 W1c1 I1c0 W1c0");
}

TEST_CASE("1f1b at pp 2 with 3 micro-batches equals the hand-written lists", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::OneFOneB, 2, 1, 3};
  // Stage 0: one warm-up forward, then one forward one backward, then the last backward.
  CHECK(to_string(stage_schedule(spec, 0)) ==
        "F0c0 sendF0c0 F1c0 sendF1c0 recvB0c1 B0c0 F2c0 sendF2c0 recvB1c1 B1c0 recvB2c1 B2c0");
  // Stage 1 (the loss): no warm-up; each forward's backward follows it.
  CHECK(to_string(stage_schedule(spec, 1)) ==
        "recvF0c0 F0c1 B0c1 sendB0c1 recvF1c0 F1c1 B1c1 sendB1c1 recvF2c0 F2c1 B2c1 sendB2c1");
  CHECK_NOTHROW(check_pipeline(spec, pipeline_schedule(spec)));
}

TEST_CASE("zero_bubble at pp 2 with 3 micro-batches equals the hand-written lists", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::ZeroBubble, 2, 1, 3};
  // Stage 0 runs each W right after its I; stage 1 holds back its first W.
  CHECK(to_string(stage_schedule(spec, 0)) ==
        "F0c0 sendF0c0 F1c0 sendF1c0 recvB0c1 I0c0 W0c0 F2c0 sendF2c0 recvB1c1 I1c0 W1c0 recvB2c1 I2c0 W2c0");
  CHECK(to_string(stage_schedule(spec, 1)) ==
        "recvF0c0 F0c1 I0c1 sendB0c1 recvF1c0 F1c1 I1c1 sendB1c1 W0c1 recvF2c0 F2c1 I2c1 sendB2c1 W1c1 W2c1");
}

TEST_CASE("interleaved_1f1b at pp 2 vpp 2 with 4 micro-batches equals the hand-written lists", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::Interleaved1F1B, 2, 2, 4};
  // Stage 0 holds chunks 0 and 2. Groups of pp = 2 micro-batches: (0,1) through chunk 0 then 2,
  // then (2,3). Warm-up 2 (pp - 1) + (vpp - 1) pp = 4 forwards, then one forward one backward;
  // backwards go through a group's chunks from the last.
  CHECK(to_string(compute_only(stage_schedule(spec, 0))) ==
        "F0c0 F1c0 F0c2 F1c2 F2c0 B0c2 F3c0 B1c2 F2c2 B0c0 F3c2 B1c0 B2c2 B3c2 B2c0 B3c0");
  CHECK(to_string(stage_schedule(spec, 0)) ==
        "F0c0 sendF0c0 F1c0 sendF1c0 recvF0c1 F0c2 sendF0c2 recvF1c1 F1c2 sendF1c2 F2c0 sendF2c0 "
        "recvB0c3 B0c2 sendB0c2 F3c0 sendF3c0 recvB1c3 B1c2 sendB1c2 recvF2c1 F2c2 sendF2c2 recvB0c1 B0c0 "
        "recvF3c1 F3c2 sendF3c2 recvB1c1 B1c0 recvB2c3 B2c2 sendB2c2 recvB3c3 B3c2 sendB3c2 recvB2c1 B2c0 "
        "recvB3c1 B3c0");
  // Stage 1 holds chunks 1 and 3 (the loss): warm-up (vpp - 1) pp = 2.
  CHECK(to_string(stage_schedule(spec, 1)) ==
        "recvF0c0 F0c1 sendF0c1 recvF1c0 F1c1 sendF1c1 recvF0c2 F0c3 B0c3 sendB0c3 recvF1c2 F1c3 B1c3 sendB1c3 "
        "recvF2c0 F2c1 sendF2c1 recvB0c2 B0c1 sendB0c1 recvF3c0 F3c1 sendF3c1 recvB1c2 B1c1 sendB1c1 "
        "recvF2c2 F2c3 B2c3 sendB2c3 recvF3c2 F3c3 B3c3 sendB3c3 recvB2c2 B2c1 sendB2c1 recvB3c2 B3c1 sendB3c1");
}

TEST_CASE("zbv hands chunk pp-1 to chunk pp on the last stage without a send", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::ZBV, 2, 2, 4};
  const auto stages = pipeline_schedule(spec);
  for (int64_t s = 0; s < 2; ++s)
    for (const Action& a : stages[s]) {
      CHECK_FALSE((a.kind == K::SendForward && a.chunk == 1));  // chunks 1 and 2 are both on stage 1
      CHECK_FALSE((a.kind == K::SendBackward && a.chunk == 2));
      if (a.kind == K::SendForward || a.kind == K::SendBackward || a.kind == K::RecvForward ||
          a.kind == K::RecvBackward)
        CHECK(peer_stage(spec, a) == 1 - s);
    }
  // Stage 0 receives chunk 2's output for its last chunk, 3, and sends chunk 3's input gradient back.
  const std::string stage0 = to_string(stages[0]);
  CHECK_THAT(stage0, Catch::Contains("recvF0c2 F0c3 I0c3 sendB0c3"));
  CHECK_NOTHROW(check_pipeline(spec, stages));
}

TEST_CASE("every schedule of every supported size passes the checks and simulates", "[parallel][pipeline]") {
  int64_t simulated = 0;
  for (SK kind : all_schedule_kinds())
    for (const ScheduleSpec& spec : all_specs(kind)) {
      INFO(describe(spec));
      const auto stages = pipeline_schedule(spec);
      REQUIRE(static_cast<int64_t>(stages.size()) == spec.pp);
      for (int64_t s = 0; s < spec.pp; ++s) REQUIRE(stages[s] == stage_schedule(spec, s));
      REQUIRE_NOTHROW(check_pipeline(spec, stages));
      // Unit costs, and uneven ones with a communication latency.
      for (const SimulationCosts& c : {costs(1, 1, 1), costs(1, 2, 0.5, 0.25)}) {
        const Simulation sim = simulate(stages, c);
        REQUIRE(sim.stages.size() == stages.size());
        REQUIRE(check_timeline(spec, sim, c) == 0);
        ++simulated;
      }
    }
  CHECK(simulated > 4000);
}

TEST_CASE("gpipe and 1f1b take (m + pp - 1)(F + B + W) with bubble (pp - 1) / m", "[parallel][pipeline]") {
  for (SK kind : {SK::GPipe, SK::OneFOneB})
    for (const ScheduleSpec& spec : all_specs(kind))
      for (const SimulationCosts& c : {costs(1, 1, 1), costs(2, 3, 1)}) {
        INFO(describe(spec) << " F=" << c.chunk.forward << " B=" << c.chunk.backward_input);
        const int64_t pp = spec.pp, m = spec.micro_batches;
        const double unit = c.chunk.forward + c.chunk.backward_input + c.chunk.backward_weight;
        const Simulation sim = simulate(pipeline_schedule(spec), c);
        CHECK(sim.makespan == Approx((m + pp - 1) * unit));
        for (int64_t s = 0; s < pp; ++s) {
          const StageTimeline& t = sim.stages[s];
          CHECK(t.idle == Approx((pp - 1) * unit));
          CHECK(t.bubble_fraction == Approx(double(pp - 1) / double(m)));
          CHECK(t.idle_fraction == Approx(double(pp - 1) / double(m + pp - 1)));
          // 1F1B: min(pp - s - 1, m) warm-up forwards plus the one before the first backward.
          CHECK(t.peak_in_flight_chunks == (kind == SK::GPipe ? m : std::min(pp - s, m)));
          CHECK(t.peak_in_flight_micro_batches == Approx(t.peak_in_flight_chunks));
          CHECK(t.peak_pending_weight == 0);
        }
      }
}

TEST_CASE("zero_bubble idles pp - 1 units against 1f1b's 3 (pp - 1) at 1f1b's activation memory", "[parallel][pipeline]") {
  for (const ScheduleSpec& spec : all_specs(SK::ZeroBubble)) {
    INFO(describe(spec));
    const int64_t pp = spec.pp, m = spec.micro_batches;
    const Simulation zb = simulate(pipeline_schedule(spec), costs(1, 1, 1));
    const Simulation one = simulate(pipeline_schedule({SK::OneFOneB, pp, 1, m}), costs(1, 1, 1));
    // With F = B = W = 1 each stage works 3m. Once every stage has work for the whole pipeline
    // (m >= pp) the step takes 3m + pp - 1: the last stage starts after pp - 1 forwards and then
    // never waits, which no order can beat. Below that it is still never slower than 1F1B.
    if (m >= pp) CHECK(zb.makespan == Approx(3 * m + pp - 1));
    CHECK(zb.makespan <= one.makespan);
    for (int64_t s = 0; s < pp; ++s) {
      if (m >= pp) {
        CHECK(zb.stages[s].idle == Approx(pp - 1));
        CHECK(one.stages[s].idle == Approx(3 * (pp - 1)));
        CHECK(zb.stages[s].bubble_fraction == Approx(double(pp - 1) / double(3 * m)));
      }
      // Same forwards and input gradients as 1F1B, so the same activations in flight; stage s
      // holds back s weight-gradient passes, plus the one just made ready.
      CHECK(zb.stages[s].peak_in_flight_chunks == std::min(pp - s, m));
      CHECK(zb.stages[s].peak_pending_weight == std::min(s + 1, m));
    }
  }
}

TEST_CASE("interleaved_1f1b has bubble (pp - 1) / (vpp m) and Megatron's warm-up when pp divides m", "[parallel][pipeline]") {
  for (const ScheduleSpec& spec : all_specs(SK::Interleaved1F1B)) {
    INFO(describe(spec));
    const int64_t pp = spec.pp, vpp = spec.vpp, m = spec.micro_batches;
    const auto stages = pipeline_schedule(spec);
    const Simulation one = simulate(pipeline_schedule({SK::OneFOneB, pp, 1, m}), costs(1, 1, 1));
    for (const SimulationCosts& c : {costs(1, 1, 1), costs(2, 3, 1)}) {
      const double unit = c.chunk.forward + c.chunk.backward_input + c.chunk.backward_weight;
      const Simulation sim = simulate(stages, c);
      if (m % pp == 0) CHECK(sim.makespan == Approx((m * vpp + pp - 1) * unit));
      for (int64_t s = 0; s < pp; ++s) {
        const StageTimeline& t = sim.stages[s];
        // Warm-up 2 (pp - 1 - s) + (vpp - 1) pp forwards, then the first steady forward before the
        // first backward: that many activations at the peak (capped at all m vpp). A last group
        // larger than pp (m not a multiple) runs up to (vpp - 1)(pp - 1) more.
        const int64_t warmup = 2 * (pp - 1 - s) + (vpp - 1) * pp;
        if (m % pp == 0) {
          CHECK(t.bubble_fraction == Approx(double(pp - 1) / double(vpp * m)));
          CHECK(forwards_before_first_backward(stages[s]) == std::min(warmup + 1, m * vpp));
          CHECK(t.peak_in_flight_chunks == std::min(warmup + 1, m * vpp));
        } else {
          CHECK(t.peak_in_flight_chunks <= std::min(warmup + 1 + (vpp - 1) * (pp - 1), m * vpp));
          CHECK(t.peak_in_flight_chunks >= std::min(warmup + 1, m * vpp));
        }
        CHECK(t.peak_in_flight_micro_batches == Approx(double(t.peak_in_flight_chunks) / double(vpp)));
      }
    }
    // With the same total work per stage as 1F1B (chunk costs 1/vpp of a stage's), never slower.
    const double v = static_cast<double>(vpp);
    CHECK(simulate(stages, costs(1 / v, 1 / v, 1 / v)).makespan <= one.makespan + 1e-9);
  }
}

TEST_CASE("zbv idles pp - 1 chunk units and holds pp micro-batches of activations", "[parallel][pipeline]") {
  for (const ScheduleSpec& spec : all_specs(SK::ZBV)) {
    INFO(describe(spec));
    const int64_t pp = spec.pp, m = spec.micro_batches;
    const Simulation sim = simulate(pipeline_schedule(spec), costs(1, 1, 1));
    // With F = B = W = 1 per chunk each stage works 6m. From m = 2pp - 1 on (the handcrafted
    // order without micro-batches cut off) the step takes 6m + pp - 1: the last stage starts after
    // pp - 1 chunk forwards and then never waits, which no order can beat.
    if (m >= 2 * pp - 1) CHECK(sim.makespan == Approx(6 * m + pp - 1));
    for (int64_t s = 0; s < pp; ++s) {
      const StageTimeline& t = sim.stages[s];
      if (m >= 2 * pp - 1) {
        CHECK(t.idle == Approx(pp - 1));
        CHECK(t.bubble_fraction == Approx(double(pp - 1) / double(6 * m)));
        // 2pp chunk activations of half a stage each: 1F1B's stage-0 peak of pp micro-batches, on
        // every stage.
        CHECK(t.peak_in_flight_chunks == 2 * pp);
        CHECK(t.peak_in_flight_micro_batches == Approx(pp));
      }
      CHECK(t.peak_in_flight_chunks <= std::min(2 * pp, 2 * m));
    }
  }
}

TEST_CASE("forward_only runs the forwards back to back and keeps no activations", "[parallel][pipeline]") {
  for (SK kind : {SK::ForwardOnly, SK::ForwardOnlyV})
    for (const ScheduleSpec& spec : all_specs(kind)) {
      INFO(describe(spec));
      const int64_t pp = spec.pp, vpp = spec.vpp, m = spec.micro_batches;
      const auto stages = pipeline_schedule(spec);
      for (const auto& actions : stages)
        for (const Action& a : actions)
          CHECK((a.kind == K::Forward || a.kind == K::SendForward || a.kind == K::RecvForward));
      const Simulation sim = simulate(stages, costs(1, 1, 1));
      if (kind == SK::ForwardOnly && (vpp == 1 || m % pp == 0)) CHECK(sim.makespan == Approx(m * vpp + pp - 1));
      if (kind == SK::ForwardOnlyV) {
        // Each stage has 2m forwards and the last micro-batch needs 2pp in a row: no worse than
        // the sum, never below either bound.
        CHECK(sim.makespan >= std::max<double>(2 * m, 2 * pp + m - 1));
        CHECK(sim.makespan <= 2 * m + 2 * pp - 1);
        CHECK(in_order_per_stage_pair(spec));
      }
      for (const StageTimeline& t : sim.stages) CHECK(t.peak_in_flight_chunks == 0);
    }
  // The V at pp = 2, 3 micro-batches: stage 0 holds chunks 0 and 3, stage 1 chunks 1 and 2.
  CHECK(to_string(stage_schedule({SK::ForwardOnlyV, 2, 2, 3}, 0)) ==
        "F0c0 sendF0c0 F1c0 sendF1c0 F2c0 sendF2c0 recvF0c2 F0c3 recvF1c2 F1c3 recvF2c2 F2c3");
}

TEST_CASE("the simulator charges costs per chunk and latency per transfer", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::OneFOneB, 2, 1, 1};
  SimulationCosts c = costs(1, 2, 3, 0.5);
  Simulation sim = simulate(pipeline_schedule(spec), c);
  // F on stage 0 [0, 1]; arrives 1.5; F on stage 1 [1.5, 2.5]; full backward 2 + 3 [2.5, 7.5];
  // arrives 8; backward on stage 0 [8, 13].
  CHECK(sim.stages[0].compute[1].start == Approx(8));
  CHECK(sim.stages[1].compute[0].start == Approx(1.5));
  CHECK(sim.makespan == Approx(13));
  CHECK(sim.stages[0].busy == Approx(6));
  CHECK(sim.stages[0].idle == Approx(7));
  c.per_chunk = {{1, 1, 1}, {4, 1, 1}};  // the last chunk carries the head and the loss
  sim = simulate(pipeline_schedule(spec), c);
  CHECK(sim.stages[1].compute[0].end - sim.stages[1].compute[0].start == Approx(4));
  CHECK(sim.makespan == Approx(1 + 0.5 + 4 + 2 + 0.5 + 2));
  c.per_chunk = {{1, 1, 1}};
  CHECK_THROWS_AS(simulate(pipeline_schedule(spec), c), std::invalid_argument);
  CHECK_THROWS_AS(simulate(pipeline_schedule(spec), costs(-1, 1, 1)), std::invalid_argument);
}

TEST_CASE("a deadlock is reported with the stuck actions", "[parallel][pipeline]") {
  // Each stage waits for the other first.
  const std::vector<std::vector<Action>> crossed{
      {{K::Forward, 0, 0}, {K::RecvBackward, 0, 1}, {K::SendForward, 0, 0}, {K::Backward, 0, 0}},
      {{K::RecvForward, 0, 0}, {K::Forward, 0, 1}, {K::Backward, 0, 1}, {K::SendBackward, 0, 1}}};
  CHECK_THROWS_WITH(simulate(crossed),
                    Catch::Contains("deadlock") && Catch::Contains("stage 0 waits at recvB0c1") &&
                        Catch::Contains("stage 1 waits at recvF0c0"));
  CHECK_THROWS_WITH(check_pipeline({SK::OneFOneB, 2, 1, 1}, crossed), Catch::Contains("deadlock"));
  // A receive whose send never comes.
  std::vector<std::vector<Action>> unsent = pipeline_schedule({SK::OneFOneB, 2, 1, 1});
  std::erase(unsent[0], Action{K::SendForward, 0, 0});
  CHECK_THROWS_WITH(simulate(unsent), Catch::Contains("stage 1 waits at recvF0c0"));
}

TEST_CASE("the pipeline check refuses unmatched or misplaced actions", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::OneFOneB, 2, 1, 2};
  const auto good = pipeline_schedule(spec);
  REQUIRE_NOTHROW(check_pipeline(spec, good));

  auto lists = good;
  std::erase(lists[0], Action{K::SendForward, 1, 0});
  CHECK_THROWS_WITH(check_pipeline(spec, lists), Catch::Contains("recvF1c0") && Catch::Contains("never sent"));

  lists = good;
  std::erase(lists[1], Action{K::RecvForward, 1, 0});
  CHECK_THROWS_WITH(check_pipeline(spec, lists), Catch::Contains("F1c1"));  // its input never arrives

  lists = good;  // both receives before their forwards, but in another order than the sends
  REQUIRE(to_string(lists[1]) == "recvF0c0 F0c1 B0c1 sendB0c1 recvF1c0 F1c1 B1c1 sendB1c1");
  lists[1].erase(lists[1].begin() + 4);
  lists[1].insert(lists[1].begin(), Action{K::RecvForward, 1, 0});
  CHECK_THROWS_WITH(check_pipeline(spec, lists),
                    Catch::Contains("recvF1c0") && Catch::Contains("stage 0 sends sendF0c0 to this stage first"));

  lists = good;  // a forward on a stage that does not hold its chunk
  lists[0].insert(lists[0].begin(), Action{K::Forward, 0, 1});
  CHECK_THROWS(check_pipeline(spec, lists));

  lists = good;  // a micro-batch missing altogether
  std::erase_if(lists[0], [](const Action& a) { return a.micro_batch == 1; });
  std::erase_if(lists[1], [](const Action& a) { return a.micro_batch == 1; });
  CHECK_THROWS_WITH(check_pipeline(spec, lists), Catch::Contains("F1c0") && Catch::Contains("missing"));

  CHECK_THROWS_WITH(check_pipeline(spec, {good[0]}), Catch::Contains("1 action lists for pp=2"));
}

TEST_CASE("the stage check follows the data through sends and receives", "[parallel][pipeline]") {
  const auto fails = [](std::vector<Action> actions, const char* text, bool forward_only = false) {
    CHECK_THROWS_WITH(check_schedule(actions, forward_only), Catch::Contains(text));
  };
  fails({{K::SendForward, 0, 0}, {K::Forward, 0, 0}, {K::RecvBackward, 0, 1}, {K::Backward, 0, 0}},
        "sendF0c0: sends an output before");
  fails({{K::Forward, 0, 1}, {K::RecvForward, 0, 0}, {K::Backward, 0, 1}}, "F0c1: its input");
  fails({{K::Forward, 0, 0}, {K::SendForward, 0, 0}, {K::Backward, 0, 0}}, "B0c0: the gradient of its output");
  fails({{K::RecvForward, 0, 0}, {K::RecvForward, 0, 0}, {K::Forward, 0, 1}, {K::Backward, 0, 1}},
        "a second send or receive");
  fails({{K::RecvForward, 0, 0}}, "recvF0c0: no forward of chunk 1 after it");
  fails({{K::Forward, 0, 0}, {K::Backward, 0, 0}}, "backward action in a forward-only", true);
  // Two chunks on one stage, handed over locally; the last one's output is the loss.
  CHECK_NOTHROW(check_schedule({{K::Forward, 0, 0}, {K::Forward, 0, 1}, {K::Backward, 0, 1}, {K::Backward, 0, 0}}));
  fails({{K::Forward, 0, 0}, {K::Forward, 0, 1}, {K::Backward, 0, 0}, {K::Backward, 0, 1}}, "B0c0");
  CHECK_NOTHROW(check_schedule({{K::RecvForward, 0, 3}, {K::Forward, 0, 4}, {K::SendForward, 0, 4}}, true));
}

TEST_CASE("the text chart draws each stage on a time grid with its bubble and peak", "[parallel][pipeline]") {
  const Simulation sim = simulate(pipeline_schedule({SK::OneFOneB, 2, 1, 2}), costs(1, 1, 1));
  const std::string chart = schedule_chart(sim);
  CHECK_THAT(chart, Catch::Contains("stage 0  |F0 F1 .  .  B0 -- .  B1 --\n"));
  CHECK_THAT(chart, Catch::Contains("stage 1  |.  F0 B0 -- F1 B1 -- .  .\n"));
  CHECK_THAT(chart, Catch::Contains("one column = 1 time unit;"));
  CHECK_THAT(chart, Catch::Contains("step time 9\n"));
  CHECK_THAT(chart, Catch::Contains("50.0%"));  // (pp - 1) / m

  // Several chunks per stage: labels carry the model chunk; half-unit costs halve the column.
  const std::string interleaved =
      schedule_chart(simulate(pipeline_schedule({SK::Interleaved1F1B, 2, 2, 2}), costs(0.5, 1, 1)));
  CHECK_THAT(interleaved, Catch::StartsWith("stage 0  |F0c0 F1c0 F0c2 F1c2 .    .    .    .    B0c2 ---- ---- ----"));
  CHECK_THAT(interleaved, Catch::Contains("one column = 0.5 time units"));
}

TEST_CASE("the Chrome trace has one complete event per compute action", "[parallel][pipeline]") {
  const ScheduleSpec spec{SK::OneFOneB, 2, 1, 2};
  const auto stages = pipeline_schedule(spec);
  const Simulation sim = simulate(stages, costs(1, 1, 1));
  const nlohmann::json trace = chrome_trace(sim);
  int complete = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") {
      CHECK(e.at("name") == "thread_name");
      continue;
    }
    ++complete;
    CHECK(e.at("ph") == "X");
    CHECK(e.at("pid") == 0);
    if (e.at("name") == "B0c1") {
      CHECK(e.at("tid") == 1);
      CHECK(e.at("ts").get<double>() == Approx(2000));  // one time unit = 1000 microseconds
      CHECK(e.at("dur").get<double>() == Approx(2000));
      CHECK(e.at("args").at("micro_batch") == 0);
      CHECK(e.at("args").at("chunk") == 1);
    }
  }
  CHECK(complete == 8);
  const nlohmann::json report = schedule_json(spec, stages, sim);
  CHECK(report.at("schedule") == "1f1b");
  CHECK(report.at("step_time").get<double>() == Approx(9));
  CHECK(report.at("stages").at(1).at("actions") == to_string(stages[1]));
  CHECK(report.at("stages").at(0).at("peak_in_flight_chunks") == 2);
}

TEST_CASE("NCCL order: gpipe - 1f1b and zero_bubble keep one order between two stages - interleaved remainders and zbv do not", "[parallel][pipeline]") {
  using trainer::parallel::ScheduleKind;
  using trainer::parallel::ScheduleSpec;
  using trainer::parallel::in_order_per_stage_pair;
  for (int64_t pp : {2, 3, 4})
    for (int64_t m : {4, 8}) {
      CAPTURE(pp, m);
      CHECK(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::GPipe, pp, 1, m}));
      CHECK(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::OneFOneB, pp, 1, m}));
      CHECK(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::ZeroBubble, pp, 1, m}));
    }
  // Interleaving keeps the order where pp divides the micro-batches, not where the last group takes
  // a remainder; zbv mixes them from 3 micro-batches on.
  CHECK(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::Interleaved1F1B, 2, 2, 4}));
  CHECK_FALSE(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::Interleaved1F1B, 2, 2, 5}));
  CHECK_FALSE(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::ZBV, 2, 2, 4}));
  CHECK_FALSE(in_order_per_stage_pair(ScheduleSpec{ScheduleKind::ZBV, 4, 2, 8}));
}
