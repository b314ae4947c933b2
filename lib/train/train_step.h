#pragma once
// One optimizer step's gradients on this rank (DESIGN.md section 4): the step's micro-batches
// (this data-parallel rank's slice of the global batch), the number of real targets in the global
// batch (those not ignored, summed over the data-parallel ranks before any backward, so that every
// mesh normalises the loss the same way), and the step executor running the schedule's forward and
// backward actions; then the gradient reductions and the gradient norm. Every figure stays on the
// device: nothing here waits for the host.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "data/dataset.h"
#include "mesh/process_groups.h"
#include "model/transformer.h"
#include "recipe/load.h"
#include "engine/executor.h"
#include "train/batch.h"
#include "train/optimizer_driver.h"
#include "train/pipeline_plan.h"
#include "train/step_times.h"

namespace trainer::train {

// 0-dim double tensors on the device, over the whole global batch.
struct StepFigures {
  at::Tensor loss_sum;     // token losses summed
  at::Tensor aux_sum;      // MoE load-balancing losses summed over micro-batches and data-parallel ranks
  at::Tensor mtp_sum;      // multi-token prediction cross-entropy sums (all modules), like loss_sum; undefined without MTP
  at::Tensor real_tokens;  // targets in the loss
  // data.document_masking: the sum over the global batch's samples of their documents' squared
  // lengths (document_squares), the attention work MFU counts; undefined without masking.
  at::Tensor document_squares;
  at::Tensor grad_norm;    // before clipping
  // On the CPU only (host time is meaningful there): [model chunks, 3] doubles, the seconds one
  // micro-batch spends in each chunk's forward, backward (zero-bubble: input gradient) and weight
  // gradient (zero-bubble only), gathered from every stage. Undefined on a GPU.
  at::Tensor chunk_seconds;
  // On the CPU only: [pp] doubles, each stage's peak tensor bytes (tracked since the last logged
  // step) at the end of its backward, gathered from every stage.
  at::Tensor stage_peak_bytes;
  // MoE models: [MoE layers, experts] doubles, the token copies each expert processed in the step
  // (after capacity), summed over the data-parallel ranks; rows in model.moe.layers order.
  at::Tensor moe_load;
  at::Tensor z_sum;       // MoE router z-losses summed over micro-batches and data-parallel ranks
  at::Tensor min_margin;  // the smallest top-k routing margin of the step over all ranks (Routing::margin)
  // Host timers of this rank (train/step_times.h): data, forward, backward and collective waits of
  // computing the gradients; the training loop adds the optimizer and checkpoint phases.
  StepTimes times;
};

class TrainStep {
 public:
  TrainStep(model::Transformer& model, OptimizerDriver& optimizer, const data::Dataset& dataset,
            const recipe::Recipe& recipe, const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups,
            const PipelinePlan& pipeline, c10::Device device);

  // Gradients of the global batch that starts at sample `consumed_samples`, reduced; the norm.
  StepFigures compute_gradients(int64_t consumed_samples);

 private:
  // This rank's micro-batches of the global batch that starts at `consumed_samples`; their real
  // targets are added to f.real_tokens (this rank's count).
  std::vector<MicroBatch> load_micro_batches(int64_t consumed_samples, StepFigures& f) const;
  // On the CPU: each model chunk's compute seconds per micro-batch and each stage's peak memory,
  // summed over the pipeline group so that every stage has every row.
  void record_chunk_times(const engine::StepExecutor& executor, StepFigures& f) const;
  // MoE statistics of the step from every layer's MoeStepState, over all ranks.
  void gather_moe_statistics(StepFigures& f) const;

  model::Transformer& model_;
  OptimizerDriver& optimizer_;
  const data::Dataset& dataset_;
  const recipe::Recipe& recipe_;
  const recipe::MeshShape& mesh_;
  const mesh::ProcessGroups& groups_;
  const PipelinePlan& pipeline_;
  c10::Device device_;
};

// Sums 0-dim tensors over a group in one collective (on the device, waits for the collective only).
void all_reduce_scalars(comm::Communicator& group, std::vector<at::Tensor*> values);

}  // namespace trainer::train
