#pragma once
// What checkpoints cost a recipe on a mesh, for the cadence advice of `trainer estimate`
// (checkpoint_cadence.h): the bytes one rank saves, what training waits for per save, how far
// apart asynchronous saves must be, and the time from a failure to training again. Torch-free.
//
//   bytes per rank  the largest pipeline stage's parameters and optimizer state (fp32 master
//                   weights in bf16 training, the optimizer's moments) divided among the ranks
//                   that hold them alike, as the writer spreads replicated tensors over them
//                   (docs/checkpoint.md, "Who writes what")
//   asynchronous    stall = kSnapshotStartS + what of the snapshot copy (bytes / host.d2h_gb_s)
//                   the next step's forward and backward do not cover (the copy runs on a side
//                   stream; the compute stream waits for it before the next optimizer step); the
//                   background write (bytes / storage.gb_s) must end before the next save begins,
//                   or that save waits for it: min_interval = snapshot + write
//   synchronous     stall = the write (bytes / storage.gb_s)
//   restart         kRestartStartS + reading this rank's part of the checkpoint (bytes / storage.gb_s)
#include "estimate/checkpoint_cadence.h"
#include "estimate/estimate.h"
#include "estimate/hardware.h"
#include "recipe/recipe.h"

namespace trainer::estimate {

// The fixed part of an asynchronous save's stall: scripts/bench_ckpt's median asynchronous stall
// (starting the snapshot and the fence before the next optimizer step, its copy hidden), measured
// on the 2-core development VM (docs/checkpoint.md, 2026-11-23).
inline constexpr double kSnapshotStartS = 0.004;
// Assumed (not measured): stopping the job, starting the processes again, the rendezvous, NCCL's
// communicators and the first steps, before reading the checkpoint. A hang that nothing notices
// until parallel.collective_timeout_s adds that timeout; not counted.
inline constexpr double kRestartStartS = 60;

struct CheckpointCost {
  double bytes_per_rank = 0;   // the largest share one rank writes (and reads back on a restart)
  double snapshot_s = 0;       // asynchronous: the copy of those bytes to host memory
  double hidden_s = 0;         // asynchronous: the next step's forward and backward, which the copy runs behind
  double write_s = 0;          // the bytes at the storage bandwidth per GPU
  double stall_s = 0;          // what training waits for per save
  double min_interval_s = 0;   // asynchronous: snapshot + write; 0 for synchronous saves
  double restart_s = 0;        // kRestartStartS + reading the bytes back
};

// Bytes of parameters and optimizer state one rank of the largest stage writes.
double checkpoint_bytes_per_rank(const recipe::Recipe& recipe, const JobEstimate& estimate);

// Precondition: `estimate` has a step time (estimate.has_time: a GPU estimate).
CheckpointCost checkpoint_cost(const recipe::Recipe& recipe, const JobEstimate& estimate, const HardwareProfile& gpu);

// The cadence inputs of the recipe (hardware.gpu_mtbf_hours, checkpoint.dir and interval,
// training.steps) on the estimate's mesh, with `cost`.
CadenceInputs cadence_inputs(const recipe::Recipe& recipe, const JobEstimate& estimate, const CheckpointCost& cost);

}  // namespace trainer::estimate
