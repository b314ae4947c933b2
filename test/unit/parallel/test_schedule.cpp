// Schedules as data: the single-stage list and the checks every list must pass.
#include <catch2/catch.hpp>

#include "parallel/pipeline/schedule.h"

using namespace trainer::parallel;
using K = Action::Kind;

TEST_CASE("one stage runs forward then backward of each micro-batch in turn", "[parallel][schedule]") {
  const auto actions = single_stage_schedule(3);
  std::string text;
  for (const auto& a : actions) text += to_string(a) + " ";
  CHECK(text == "F0c0 B0c0 F1c0 B1c0 F2c0 B2c0 ");
  CHECK_NOTHROW(check_schedule(actions));
}

TEST_CASE("a schedule that cannot run is refused naming the action", "[parallel][schedule]") {
  CHECK_THROWS_WITH(check_schedule({{K::Backward, 0, 0}}), Catch::Contains("B0c0"));
  CHECK_THROWS_WITH(check_schedule({{K::Forward, 1, 0}, {K::Forward, 1, 0}}), Catch::Contains("second forward"));
  CHECK_THROWS_WITH(check_schedule({{K::Forward, 0, 1}}), Catch::Contains("never finishes"));
  CHECK_THROWS_WITH(check_schedule({{K::Forward, 0, 0}, {K::BackwardWeight, 0, 0}}), Catch::Contains("W0c0"));
  // Zero-bubble's split: input gradients first, weight gradients later, in any interleaving.
  CHECK_NOTHROW(check_schedule({{K::Forward, 0, 0}, {K::BackwardInput, 0, 0}, {K::Forward, 1, 0},
                                {K::BackwardInput, 1, 0}, {K::BackwardWeight, 0, 0}, {K::BackwardWeight, 1, 0}}));
}
