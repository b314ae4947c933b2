#include "estimate/checkpoint_cost.h"

#include <algorithm>

#include "estimate/job_layout.h"
#include "estimate/optimizer_cost.h"

namespace trainer::estimate {

double checkpoint_bytes_per_rank(const recipe::Recipe& recipe, const JobEstimate& estimate) {
  const JobLayout job = layout_job(recipe, estimate.mesh, Device::Gpu, 1, &estimate.counts);
  const auto& mesh = job.mesh;
  const double e = double(job.shape.dtype_bytes);
  const OptimizerCost cost = optimizer_cost(recipe.optimizer, job.shape.dtype_bytes);
  // Dense parameters and their state are held alike by the dp x cp ranks of a stage (whole, or
  // as ZeRO shards that together make one copy), norm weights by its tp x dp x cp ranks (tp does
  // not split them), expert ones by the edp ranks: each writes its share.
  const double dense_ranks = double(mesh.dp * mesh.cp), expert_ranks = double(mesh.edp);
  const double norm_ranks = dense_ranks * double(mesh.tp);
  double largest = 0;
  for (const auto& stage : job.stages) {
    const auto& p = stage.params;
    const double norm = double(p.norm) / norm_ranks, tables = double(p.tables) / dense_ranks;
    const double dense = double(p.dense - p.norm) / dense_ranks + norm, expert = double(p.expert) / expert_ranks;
    const double matrices = dense + expert - norm - tables;
    largest = std::max(largest, (e + cost.master_bytes) * (dense + expert) + cost.matrix_bytes * matrices +
                                    cost.table_bytes * tables + cost.vector_bytes * norm);
  }
  return largest;
}

CheckpointCost checkpoint_cost(const recipe::Recipe& recipe, const JobEstimate& estimate, const HardwareProfile& gpu) {
  CheckpointCost c;
  c.bytes_per_rank = checkpoint_bytes_per_rank(recipe, estimate);
  c.write_s = c.bytes_per_rank / gpu.storage_bytes_per_s;
  if (recipe.checkpoint.async) {
    c.snapshot_s = c.bytes_per_rank / gpu.host_d2h_bytes_per_s;
    c.hidden_s = std::max(0.0, estimate.step_time_s - estimate.time.optimizer_s);
    c.stall_s = kSnapshotStartS + std::max(0.0, c.snapshot_s - c.hidden_s);
    c.min_interval_s = c.snapshot_s + c.write_s;
  } else {
    c.stall_s = c.write_s;
  }
  c.restart_s = kRestartStartS + c.bytes_per_rank / gpu.storage_bytes_per_s;
  return c;
}

CadenceInputs cadence_inputs(const recipe::Recipe& recipe, const JobEstimate& estimate, const CheckpointCost& cost) {
  CadenceInputs in;
  in.gpus = estimate.mesh.world_size;
  in.gpu_mtbf_hours = recipe.hardware.gpu_mtbf_hours;
  in.step_s = estimate.step_time_s;
  in.run_steps = recipe.training.steps;
  in.interval_steps = recipe.checkpoint.interval;
  in.enabled = recipe.checkpoint.dir.has_value();
  in.stall_s = cost.stall_s;
  in.min_interval_s = cost.min_interval_s;
  in.restart_s = cost.restart_s;
  return in;
}

}  // namespace trainer::estimate
