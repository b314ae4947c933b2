// The estimator's view of a schedule comes from the runtime's generator and simulator; where the
// papers' closed forms hold, they agree.
#include <catch2/catch.hpp>

#include "estimate/pipeline_schedule.h"

using namespace trainer::estimate;
using K = trainer::parallel::ScheduleKind;

TEST_CASE("1F1B: stage r holds pp - r micro-batches", "[estimate]") {
  for (int64_t r = 0; r < 4; ++r) CHECK(peak_inflight_chunks(K::OneFOneB, 4, 1, r, 8) == 4 - r);
  // Fewer micro-batches than stages: capped.
  CHECK(peak_inflight_chunks(K::OneFOneB, 8, 1, 0, 3) == 3);
  // No pipeline: one micro-batch at a time.
  CHECK(peak_inflight_chunks(K::OneFOneB, 1, 1, 0, 16) == 1);
  // Zero-bubble keeps 1F1B's activations.
  for (int64_t r = 0; r < 4; ++r) CHECK(peak_inflight_chunks(K::ZeroBubble, 4, 1, r, 8) == 4 - r);
}

TEST_CASE("GPipe holds every micro-batch's activations", "[estimate]") {
  CHECK(peak_inflight_chunks(K::GPipe, 4, 1, 0, 8) == 8);
  CHECK(peak_inflight_chunks(K::GPipe, 4, 1, 3, 8) == 8);
  CHECK(peak_inflight_chunks(K::GPipe, 1, 1, 0, 5) == 5);
}

TEST_CASE("interleaved 1F1B: 2 (pp - r - 1) + (v - 1) pp warm-up forwards + 1 (Narayanan et al. 2021)", "[estimate]") {
  // pp 4, v 2, 8 micro-batches: stage 0 warms up with 2*3 + 1*4 = 10 chunk forwards, holds 11:
  // pp + (pp - 1)/v micro-batches' worth (11 chunks of 1/2 = 5.5 micro-batches).
  CHECK(peak_inflight_chunks(K::Interleaved1F1B, 4, 2, 0, 8) == 11);
  CHECK(peak_inflight_chunks(K::Interleaved1F1B, 4, 2, 3, 8) == 5);
  // Capped at every chunk of every micro-batch.
  CHECK(peak_inflight_chunks(K::Interleaved1F1B, 4, 2, 0, 4) == 8);
}

TEST_CASE("bubble: (pp - 1) / m - divided by v when interleaved - a third for zero-bubble - more micro-batches smaller", "[estimate]") {
  CHECK(bubble_fraction(K::OneFOneB, 4, 1, 8) == Approx(3.0 / 8));
  CHECK(bubble_fraction(K::GPipe, 4, 1, 8) == Approx(3.0 / 8));
  CHECK(bubble_fraction(K::Interleaved1F1B, 4, 2, 8) == Approx(3.0 / 16));
  CHECK(bubble_fraction(K::ZeroBubble, 4, 1, 8) == Approx(3.0 / 24));
  CHECK(bubble_fraction(K::OneFOneB, 1, 1, 8) == 0);
  double previous = 1e9;
  for (int64_t m = 4; m <= 256; m *= 2) {
    const double b = bubble_fraction(K::OneFOneB, 4, 1, m);
    CHECK(b < previous);
    previous = b;
  }
  CHECK_THROWS(peak_inflight_chunks(K::OneFOneB, 4, 1, 4, 8));
}
