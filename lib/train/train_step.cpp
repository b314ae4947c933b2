#include "train/train_step.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <limits>

#include "metrics/cpu_memory.h"
#include "engine/executor.h"
#include "train/batch.h"

namespace trainer::train {

TrainStep::TrainStep(model::Transformer& model, OptimizerDriver& optimizer, const data::Dataset& dataset,
                     const recipe::Recipe& recipe, const recipe::MeshShape& mesh, const mesh::ProcessGroups& groups,
                     const PipelinePlan& pipeline, c10::Device device)
    : model_(model),
      optimizer_(optimizer),
      dataset_(dataset),
      recipe_(recipe),
      mesh_(mesh),
      groups_(groups),
      pipeline_(pipeline),
      device_(device) {}

void all_reduce_scalars(comm::Communicator& group, std::vector<at::Tensor*> values) {
  if (group.size() == 1) return;
  std::vector<at::Tensor> parts;
  for (at::Tensor* v : values) parts.push_back(*v);
  at::Tensor packed = at::stack(parts);
  group.all_reduce(packed, comm::ReduceOp::Sum)->wait();
  for (size_t i = 0; i < values.size(); ++i) *values[i] = packed[int64_t(i)];
}

std::vector<MicroBatch> TrainStep::load_micro_batches(int64_t consumed_samples, StepFigures& f) const {
  const int64_t accumulation = mesh_.grad_accum_steps, batch = recipe_.training.micro_batch_size;
  const int64_t seq_len = recipe_.training.seq_len;
  const BatchOptions options = BatchOptions::of(recipe_);
  const auto plan = global_batch_samples(dataset_, uint64_t(consumed_samples), mesh_.dp, accumulation, batch, seq_len,
                                         options, recipe_.data.balanced());
  std::vector<MicroBatch> batches;
  for (int64_t m = 0; m < accumulation; ++m) {
    const MicroBatch whole = make_micro_batch(dataset_, plan[size_t(groups_.coordinates().dp)][size_t(m)], seq_len,
                                              device_, options);
    // The masked attention work of the global batch (MFU counts only it): each dp rank's
    // documents once (cp ranks share them).
    if (whole.context.documents.defined() && groups_.coordinates().cp == 0)
      f.document_squares += document_squares(whole.context.documents).to(f.document_squares.scalar_type());
    batches.push_back(context_part(whole, mesh_.cp, groups_.coordinates().cp,
                                   recipe_.parallel.cp_method == recipe::CpMethod::Ring));
    f.real_tokens += (batches.back().targets != model::kIgnoreIndex).sum();
  }
  return batches;
}

void TrainStep::record_chunk_times(const engine::StepExecutor& executor, StepFigures& f) const {
  // Each chunk and each stage's peak has one row, filled by its stage: a sum over the pipeline
  // group fills them all.
  const auto& seconds = executor.compute_seconds();
  const int64_t chunks = int64_t(seconds.size());
  at::Tensor packed = at::zeros({chunks * 3 + mesh_.pp}, at::kDouble);
  auto view = packed.accessor<double, 1>();
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t k = 0; k < 3; ++k) view[c * 3 + k] = seconds[size_t(c)][size_t(k)] / double(mesh_.grad_accum_steps);
  view[chunks * 3 + pipeline_.stage] = double(metrics::CpuMemoryTracker::peak_bytes());
  if (mesh_.pp > 1) groups_.get(mesh::GroupKind::Pp).all_reduce(packed, comm::ReduceOp::Sum)->wait();
  f.chunk_seconds = packed.narrow(0, 0, chunks * 3).view({chunks, 3});
  f.stage_peak_bytes = packed.narrow(0, chunks * 3, mesh_.pp);
}

StepFigures TrainStep::compute_gradients(int64_t consumed_samples) {
  comm::Communicator& dp = groups_.get(mesh::GroupKind::DpCp);
  const auto scalar = at::TensorOptions().dtype(at::kDouble).device(device_);
  const std::atomic<int64_t>& wait_ns = groups_.context().wait_ns;
  const PhaseClock whole(wait_ns), data(wait_ns);

  // All micro-batches first: the loss is normalised by the real targets of the global batch.
  StepFigures f;
  f.loss_sum = at::zeros({}, scalar);
  f.aux_sum = at::zeros({}, scalar);
  if (recipe_.model.num_nextn_predict_layers > 0) f.mtp_sum = at::zeros({}, scalar);
  f.real_tokens = at::zeros({}, scalar);
  if (recipe_.data.document_masking) f.document_squares = at::zeros({}, scalar);
  const std::vector<MicroBatch> batches = load_micro_batches(consumed_samples, f);
  f.times.data_s = data.seconds();
  if (f.document_squares.defined())
    all_reduce_scalars(dp, {&f.real_tokens, &f.document_squares});
  else
    all_reduce_scalars(dp, {&f.real_tokens});
  // At least one, so that a batch whose targets are all ignored gives a zero loss, not NaN.
  const at::Tensor divisor = at::clamp_min(f.real_tokens, 1.0).to(at::kFloat);

  const int64_t last_chunk = pipeline_.model_chunks() - 1;
  // Model chunk c of micro-batch m: the hidden state for the next chunk, or the loss as backward
  // sees it on the model's last chunk.
  auto forward = [&](int64_t m, int64_t c, const at::Tensor& input) {
    const MicroBatch& mb = batches[size_t(m)];
    model::ForwardOutput out;
    const at::Tensor y =
        model_.forward_chunk(pipeline_.local_chunk(c), input, mb.inputs, mb.targets, &out, mb.context);
    // The MoE layers' losses reach backward through their outputs (model/aux_loss_scaler.h).
    if (out.aux_loss.defined()) f.aux_sum += out.aux_loss.detach();
    if (c != last_chunk) return y;
    f.loss_sum += out.loss_sum.detach();
    if (out.mtp_loss_sum.defined()) f.mtp_sum += out.mtp_loss_sum;
    return out.objective / divisor;
  };
  engine::StepExecutor::GradientHooks hooks;
  hooks.begin_backward = [this](int64_t c, bool last) { optimizer_.begin_backward(pipeline_.local_chunk(c), last); };
  hooks.end_backward = [this](int64_t c) { optimizer_.end_backward(pipeline_.local_chunk(c)); };
  const engine::PipelineLinks links = pipeline_links(
      pipeline_.spec, recipe_, mesh_, groups_, at::TensorOptions().dtype(model_.options().dtype).device(device_));
  engine::StepExecutor executor(forward, hooks, &model_.parameters().weight_grads(), pipeline_.model_chunks(), links);
  executor.count_collective_waits(&wait_ns);

  optimizer_.begin_step();
  model_.begin_step();
  executor.run(parallel::stage_schedule(pipeline_.spec, pipeline_.stage));
  const auto compute = executor.compute_seconds_without_waits();
  f.times.forward_s = compute[0];
  f.times.backward_s = compute[1];
  if (device_.is_cpu()) record_chunk_times(executor, f);
  optimizer_.finish_gradients();
  all_reduce_scalars(dp, {&f.loss_sum});
  if (f.mtp_sum.defined()) all_reduce_scalars(dp, {&f.mtp_sum});
  // MoE losses are split over the tp ranks too (each routes its part of the sequence).
  all_reduce_scalars(groups_.get(mesh::GroupKind::TpDpCp), {&f.aux_sum});
  // The loss lives on the stage of the model's last chunk: every stage gets it.
  if (mesh_.pp > 1) all_reduce_scalars(groups_.get(mesh::GroupKind::Pp), {&f.loss_sum, &f.aux_sum});
  if (mesh_.pp > 1 && f.mtp_sum.defined()) all_reduce_scalars(groups_.get(mesh::GroupKind::Pp), {&f.mtp_sum});
  if (recipe_.model.moe) gather_moe_statistics(f);
  f.grad_norm = optimizer_.grad_norm();
  f.times.comm_wait_s = whole.waited();
  return f;
}

void TrainStep::gather_moe_statistics(StepFigures& f) const {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> layers = recipe_.model.routed_layers();
  const int64_t experts = recipe_.model.moe->num_local_experts, rows = int64_t(layers.size());
  // Loads then the z-loss sum in one tensor (summed), the margin apart (a maximum of its negation).
  at::Tensor sums = at::zeros({rows * experts + 1}, at::TensorOptions().dtype(at::kDouble).device(device_));
  at::Tensor margin = at::full({1}, -std::numeric_limits<double>::infinity(), sums.options());
  for (const auto& [index, moe] : model_.moe_layers()) {
    const model::MoeStepState& s = moe->step_state();
    if (!s.tokens_per_expert.defined()) continue;
    const int64_t row = int64_t(std::find(layers.begin(), layers.end(), index) - layers.begin());
    sums.narrow(0, row * experts, experts).copy_(s.tokens_per_expert);
    sums[rows * experts] += s.z_loss.to(at::kDouble);
    margin = at::maximum(margin, -s.min_margin.to(at::kDouble).reshape({1}));
  }
  for (auto kind : {mesh::GroupKind::TpDpCp, mesh::GroupKind::Pp}) {
    comm::Communicator& group = groups_.get(kind);
    if (group.size() == 1) continue;
    group.all_reduce(sums, comm::ReduceOp::Sum)->wait();
    group.all_reduce(margin, comm::ReduceOp::Max)->wait();
  }
  f.moe_load = sums.narrow(0, 0, rows * experts).view({rows, experts});
  f.z_sum = sums[rows * experts];
  f.min_margin = -margin[0];
}

}  // namespace trainer::train
