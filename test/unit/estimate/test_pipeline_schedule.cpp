#include <catch2/catch.hpp>

#include "estimate/pipeline_schedule.h"

using namespace trainer::estimate;

TEST_CASE("1F1B: stage r warms up with pp - r - 1 forwards and holds pp - r micro-batches", "[estimate]") {
  for (int64_t r = 0; r < 4; ++r) {
    CHECK(warmup_forwards(Schedule::OneFOneB, 4, 1, r, 8) == 3 - r);
    CHECK(peak_inflight_chunks(Schedule::OneFOneB, 4, 1, r, 8) == 4 - r);
  }
  // Fewer micro-batches than stages: capped.
  CHECK(peak_inflight_chunks(Schedule::OneFOneB, 8, 1, 0, 3) == 3);
  // No pipeline: one micro-batch at a time.
  CHECK(peak_inflight_chunks(Schedule::OneFOneB, 1, 1, 0, 16) == 1);
}

TEST_CASE("GPipe holds every micro-batch's activations", "[estimate]") {
  CHECK(peak_inflight_chunks(Schedule::GPipe, 4, 1, 0, 8) == 8);
  CHECK(peak_inflight_chunks(Schedule::GPipe, 4, 1, 3, 8) == 8);
  CHECK(warmup_forwards(Schedule::GPipe, 4, 1, 2, 8) == 8);
}

TEST_CASE("interleaved 1F1B: 2 (pp - r - 1) + (v - 1) pp warm-up forwards (Narayanan et al. 2021)", "[estimate]") {
  // pp 4, v 2, 8 micro-batches: stage 0 warms up with 2*3 + 1*4 = 10 chunk forwards.
  CHECK(warmup_forwards(Schedule::Interleaved, 4, 2, 0, 8) == 10);
  CHECK(warmup_forwards(Schedule::Interleaved, 4, 2, 3, 8) == 4);
  // Stage 0 holds pp + (pp - 1)/v micro-batches' worth: 11 chunks of 1/2 = 5.5 micro-batches.
  CHECK(peak_inflight_chunks(Schedule::Interleaved, 4, 2, 0, 8) == 11);
  // Capped at every chunk of every micro-batch.
  CHECK(peak_inflight_chunks(Schedule::Interleaved, 4, 2, 0, 4) == 8);
}

TEST_CASE("bubble: (pp - 1) / m - divided by v when interleaved - more micro-batches - smaller bubble", "[estimate]") {
  CHECK(bubble_fraction(Schedule::OneFOneB, 4, 1, 8) == Approx(3.0 / 8));
  CHECK(bubble_fraction(Schedule::GPipe, 4, 1, 8) == Approx(3.0 / 8));
  CHECK(bubble_fraction(Schedule::Interleaved, 4, 2, 8) == Approx(3.0 / 16));
  CHECK(bubble_fraction(Schedule::OneFOneB, 1, 1, 8) == 0);
  double previous = 1e9;
  for (int64_t m = 4; m <= 256; m *= 2) {
    const double b = bubble_fraction(Schedule::OneFOneB, 4, 1, m);
    CHECK(b < previous);
    previous = b;
  }
  CHECK_THROWS(parse_schedule("zb"));
  CHECK(parse_schedule("interleaved_1f1b") == Schedule::Interleaved);
  CHECK(std::string(schedule_name(Schedule::GPipe)) == "gpipe");
}
