#pragma once
// Pipeline schedules as data (DESIGN.md invariant 6): what one rank does in one optimizer step, as
// a list of actions for the step executor (executor.h). Torch-free, so that the estimator,
// `trainer validate` and `trainer schedule` use the same lists. With one stage (pp = 1) the 1F1B
// list is the trivial one: forward and backward of each micro-batch in turn.
//
// Chunks. The model is cut into pp * vpp consecutive model chunks (0 = embedding side, the last
// one = head and loss); an Action's `chunk` is always the model chunk. Each stage holds vpp of them
// ("local chunks" 0..vpp-1), placed by the schedule kind:
//   gpipe, 1f1b, zero_bubble (vpp = 1): model chunk s on stage s;
//   interleaved_1f1b, forward_only: model chunk c * pp + s is local chunk c of stage s (Megatron);
//   zbv, forward_only_v (vpp = 2): a V, model chunk s on stage s (local 0) and model chunk
//   2pp-1-s on stage s (local 1), so stage 0 holds both the first and the last model chunk.
//
// Communication. An activation or gradient is named by the micro-batch and the model chunk that
// produced it: SendForward(m, c) sends chunk c's output of micro-batch m to the stage holding chunk
// c + 1, which lists the matching RecvForward(m, c) before its Forward(m, c + 1); SendBackward(m, c)
// sends the gradient of chunk c's input to the stage holding chunk c - 1, which lists
// RecvBackward(m, c) before its backward of (m, c - 1). Chunks next to each other on one stage
// hand over locally, without either. A send comes right after the action producing its data and
// never waits; a receive stands where the stage needs the data (an executor may post it earlier).
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "recipe/choices.h"

namespace trainer::parallel {

struct Action {
  enum class Kind {
    Forward,         // forward of micro-batch m on model chunk c; its output is kept for backward
    Backward,        // backward of m on c: input and weight gradients
    BackwardInput,   // zero-bubble B: the input gradient only; weight gradients are queued
    BackwardWeight,  // zero-bubble W: the queued weight gradients of earlier BackwardInput actions
    SendForward,     // send chunk c's output of m to the stage holding chunk c + 1
    RecvForward,     // receive chunk c's output of m (the input of chunk c + 1, which is here)
    SendBackward,    // send the gradient of chunk c's input for m to the stage holding chunk c - 1
    RecvBackward,    // receive the gradient of chunk c's input for m (the output gradient of c - 1)
  };
  Kind kind = Kind::Forward;
  int64_t micro_batch = 0;
  int64_t chunk = 0;

  bool operator==(const Action& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// Forward, Backward, BackwardInput, BackwardWeight: the actions that take compute time.
bool is_compute(Action::Kind kind);

// "F3c0", "B3c0", "I3c0" (input gradient), "W3c0"; "sendF3c0", "recvF3c0", "sendB3c1", "recvB3c1".
std::string to_string(const Action& action);
std::ostream& operator<<(std::ostream& out, const Action& action);  // to_string (test messages)

// Actions joined by single spaces, for messages and tests.
std::string to_string(const std::vector<Action>& actions);

// One stage, one chunk: F0 B0 F1 B1 ... (gradient accumulation without pipelining).
std::vector<Action> single_stage_schedule(int64_t micro_batches);

// Checks that one stage's action list can run on its own terms. Compute: every (micro-batch,
// chunk) it names has exactly one forward before its backward (or B before W), and (unless
// `forward_only`) nothing is left without its backward; a forward-only list has no backward.
// Data: a forward of chunk c > 0 comes after the forward of c - 1 on this stage or after the
// receive of c - 1's output; a backward comes after the gradient of its output is here (the local
// backward of c + 1, or its receive, or nothing when the output is the loss: neither sent nor used
// here); each send comes after the action producing its data, each receive before the action using
// it, and each happens at most once. Throws std::logic_error naming the first offending action.
void check_schedule(const std::vector<Action>& actions, bool forward_only = false);

// The schedule kinds and their properties (splits_backward, is_forward_only, v_layout,
// forward_only_for) belong to the recipe, which names them (recipe/choices.h).
using recipe::ScheduleKind;
using recipe::splits_backward;
using recipe::is_forward_only;
using recipe::v_layout;
using recipe::forward_only_for;

// "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv" (the recipe's
// parallel.pipeline_schedule), "forward_only", "forward_only_v" (evaluation): for `trainer
// schedule`'s command line. parse throws std::invalid_argument listing the known names.
ScheduleKind parse_schedule_kind(const std::string& name);
std::string schedule_name(ScheduleKind kind);
const std::vector<ScheduleKind>& all_schedule_kinds();

// Where the pp * vpp model chunks live (see the top of this file). Each throws
// std::invalid_argument for a layout the kind does not take (check_layout's rules) or an index out
// of range.
struct ChunkPlace {
  int64_t stage = 0;
  int64_t local_chunk = 0;
  bool operator==(const ChunkPlace& o) const { return stage == o.stage && local_chunk == o.local_chunk; }
};
ChunkPlace place_chunk(ScheduleKind kind, int64_t pp, int64_t vpp, int64_t model_chunk);
// The stage of each model chunk (index: model chunk).
struct ScheduleSpec;
std::vector<int64_t> chunk_stages(const ScheduleSpec& spec);
int64_t model_chunk_at(ScheduleKind kind, int64_t pp, int64_t vpp, int64_t stage, int64_t local_chunk);
// The stage holding model chunk 0 (the embedding) and the one holding the last (head and loss):
// 0 and pp - 1, except in a V: 0 and 0.
int64_t first_chunk_stage(ScheduleKind kind, int64_t pp, int64_t vpp);
int64_t last_chunk_stage(ScheduleKind kind, int64_t pp, int64_t vpp);

// The layout rules: pp >= 1; gpipe, 1f1b and zero_bubble take vpp = 1; interleaved_1f1b vpp >= 2;
// zbv and forward_only_v vpp = 2; forward_only any vpp >= 1. Throws std::invalid_argument naming the rule.
void check_layout(ScheduleKind kind, int64_t pp, int64_t vpp);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int64_t pp = 1;
  int64_t vpp = 1;  // model chunks per stage
  int64_t micro_batches = 1;
};

// check_layout plus: micro_batches >= 1; interleaved_1f1b needs micro_batches >= pp (any count
// from pp on, not only multiples: Megatron's flexible grouping). Throws std::invalid_argument.
void check_spec(const ScheduleSpec& spec);

// The action list of `stage` (0-based) for one optimizer step, with its sends and receives:
//   gpipe: all forwards, then all backwards (micro-batch order);
//   1f1b: min(pp - s - 1, m) warm-up forwards on stage s, then one forward one backward, then the
//     remaining backwards (Narayanan et al. 2021);
//   interleaved_1f1b: Megatron's order over (micro-batch, local chunk) in groups of pp micro-batches
//     (the last group takes the remainder), warm-up min(2 (pp - s - 1) + (vpp - 1) pp, m vpp);
//   zero_bubble: ZB-H1 (Qi et al. 2023): 1F1B's forwards and input-gradient backwards, stage s
//     holding back its first s weight-gradient passes for the cool-down, where they fill the bubble;
//   zbv: ZB-V (Qi et al. 2023, section 6) on the V layout, split backward throughout;
//   forward_only: forwards in Megatron's interleaved order (for vpp = 1: micro-batch order);
//   forward_only_v: the forwards of both local chunks ordered by micro-batch + model chunk (the
//     earliest each can start), which is one order for all stages, so no stage waits on a later one.
// Throws std::invalid_argument (check_spec, or a stage out of range).
std::vector<Action> stage_schedule(const ScheduleSpec& spec, int64_t stage);

// stage_schedule for every stage, index = stage.
std::vector<std::vector<Action>> pipeline_schedule(const ScheduleSpec& spec);

// For a send or receive on `stage`: the stage at the other end.
int64_t peer_stage(const ScheduleSpec& spec, const Action& communication);

// Checks all stages' lists together: one list per stage, each passing check_schedule; every
// compute action on the stage holding its chunk; every (micro-batch < m, chunk) with exactly one
// forward (and, training, one backward or B + W); a send exactly where a chunk's neighbour is on
// another stage, matched by exactly one receive on that stage with the same (direction,
// micro-batch, chunk), and per (sender, receiver, activations or gradients) channel the receives
// listed in the order of the sends; and the lists run to the end when each stage executes in
// order, a receive waiting for its send (no deadlock). Throws std::logic_error naming the stage
// and action.
void check_pipeline(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& stages);

// Whether, between every two stages, the receives are listed in the order of the sends with
// activations and gradients taken together: what a transport that matches messages by posting
// order alone (NCCL) needs. True for gpipe, 1f1b and zero_bubble; false for zbv and for
// interleaved 1F1B at pp = 2 when pp does not divide the micro-batches, where activations and
// gradients flow the same way between two stages in different orders on the two sides.
bool in_order_per_stage_pair(const ScheduleSpec& spec);

}  // namespace trainer::parallel
