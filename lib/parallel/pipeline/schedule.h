#pragma once
// Pipeline schedules as data (DESIGN.md invariant 6): what one rank does in one optimizer step, as
// a list of actions for the step executor (executor.h). Torch-free, so that the estimator and
// `trainer validate` can use the same lists. With one stage (pp = 1) the list is the trivial one:
// forward and backward of each micro-batch in turn.
#include <cstdint>
#include <string>
#include <vector>

namespace trainer::parallel {

struct Action {
  enum class Kind {
    Forward,         // forward of micro-batch m on model chunk c; its output is kept for backward
    Backward,        // backward of m on c: input and weight gradients
    BackwardInput,   // zero-bubble B: the input gradient only; weight gradients are queued
    BackwardWeight,  // zero-bubble W: the queued weight gradients of earlier BackwardInput actions
  };
  Kind kind = Kind::Forward;
  int64_t micro_batch = 0;
  int64_t chunk = 0;

  bool operator==(const Action& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// "F3c0", "B3c0", "I3c0" (input gradient), "W3c0".
std::string to_string(const Action& action);

// One stage, one chunk: F0 B0 F1 B1 ... (gradient accumulation without pipelining).
std::vector<Action> single_stage_schedule(int64_t micro_batches);

// Checks that an action list can run: every micro-batch of every chunk it names has exactly one
// forward before its backward (or B before W), nothing is left without its backward. Throws
// std::logic_error naming the first offending action.
void check_schedule(const std::vector<Action>& actions);

}  // namespace trainer::parallel
