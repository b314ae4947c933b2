#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include <map>
#include <stdexcept>

namespace trainer::parallel {

std::string to_string(const Action& a) {
  const char* letter = "F";
  switch (a.kind) {
    case Action::Kind::Forward: letter = "F"; break;
    case Action::Kind::Backward: letter = "B"; break;
    case Action::Kind::BackwardInput: letter = "I"; break;
    case Action::Kind::BackwardWeight: letter = "W"; break;
  }
  return fmt::format("{}{}c{}", letter, a.micro_batch, a.chunk);
}

std::vector<Action> single_stage_schedule(int64_t micro_batches) {
  std::vector<Action> actions;
  for (int64_t m = 0; m < micro_batches; ++m) {
    actions.push_back({Action::Kind::Forward, m, 0});
    actions.push_back({Action::Kind::Backward, m, 0});
  }
  return actions;
}

void check_schedule(const std::vector<Action>& actions) {
  // Per (micro-batch, chunk): 0 nothing yet, 1 forward done, 2 input gradient done, 3 finished.
  std::map<std::pair<int64_t, int64_t>, int> state;
  for (const Action& a : actions) {
    int& s = state[{a.micro_batch, a.chunk}];
    const auto fail = [&](const char* why) {
      throw std::logic_error(fmt::format("schedule action {}: {}", to_string(a), why));
    };
    switch (a.kind) {
      case Action::Kind::Forward:
        if (s != 0) fail("a second forward");
        s = 1;
        break;
      case Action::Kind::Backward:
        if (s != 1) fail("backward without a forward before it, or twice");
        s = 3;
        break;
      case Action::Kind::BackwardInput:
        if (s != 1) fail("input gradient without a forward before it, or twice");
        s = 2;
        break;
      case Action::Kind::BackwardWeight:
        if (s != 2) fail("weight gradient without its input gradient before it, or twice");
        s = 3;
        break;
    }
  }
  for (const auto& [key, s] : state)
    if (s != 3)
      throw std::logic_error(fmt::format("schedule: micro-batch {} of chunk {} never finishes its backward", key.first,
                                         key.second));
}

}  // namespace trainer::parallel
