#pragma once
// The training loop of one rank: builds the model, the gradient buffers and optimizer, the start
// (resume or initial weights), then runs steps: the step executor's forward and backward over the
// global batch (train_step.h: loss normalised by its real-token count, gradients reduced in fp32
// buckets overlapped with backward, or ZeRO), clipping, the optimizer update with warm-up and
// decay, then the step's observers in order (step_observer.h): the routing-bias update, the stop
// vote on SIGINT/SIGTERM agreed by all ranks, one host read of the figures per logged step
// (step_reader.h), the rank-0 log, the divergence check (a non-finite loss or gradient stops the
// run naming the step and the quantity), evaluation, checkpoints and profiler traces.
#include <cstdio>
#include <string>

#include "mesh/process_groups.h"
#include "recipe/load.h"
#include "train/run_plan.h"

namespace trainer::checkpoint {
class DirClaim;
}

namespace trainer::train {

struct TrainSummary {
  int64_t first_step = 0;          // the step training started from (after resume)
  int64_t steps_completed = 0;     // optimizer steps done in total (including before a resume)
  bool stopped_by_signal = false;
  bool nothing_to_do = false;      // the checkpoint resumed from is already at training.steps
  double last_loss = 0;
  std::string last_checkpoint;     // "" when none was written
};

struct TrainOptions {
  FILE* log = stdout;   // where rank 0's lines go
  // The run's plan (train/run_plan.h: device, pipeline layout, what cannot run); none: the CPU's
  // plan, made here.
  const RunPlan* plan = nullptr;
  const checkpoint::DirClaim* claim = nullptr;  // rank 0's claim on checkpoint.dir: training stops if it is lost
};

// Runs training to recipe.training.steps (or until a stop signal). `groups` describe this rank
// (single_process_groups() for one process); the recipe must be resolved at groups' world size.
// Throws UserError for bad input (data files, checkpoints) and std::runtime_error for failures.
TrainSummary train(const recipe::LoadedRecipe& recipe, mesh::ProcessGroups& groups, const TrainOptions& options = {});

}  // namespace trainer::train
