#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>

#include <map>
#include <optional>
#include <vector>

#include "checkpoint/dir_check.h"
#include "core/error.h"
#include "checkpoint/dir_claim.h"
#include "data/dataset.h"
#include "metrics/cpu_memory.h"
#include "model/transformer.h"
#include "optim/lr_schedule.h"
#include "runtime/stop_signal.h"
#include "train/checkpointing.h"
#include "train/divergence_check.h"
#include "train/optimizer_driver.h"
#include "train/periodic_evaluation.h"
#include "train/profiling.h"
#include "train/routing_bias_update.h"
#include "train/run_start.h"
#include "train/step_log.h"
#include "train/step_observer.h"
#include "train/step_reader.h"
#include "train/stop_vote.h"
#include "train/straggler_watch.h"
#include "train/train_step.h"
#include "train/training_state.h"

namespace trainer::train {

namespace {

c10::Device training_device(const runtime::DeviceAssignment& assigned) {
  if (!assigned.on_gpu) {
    metrics::CpuMemoryTracker::install();
    return c10::Device(c10::DeviceType::CPU);
  }
  c10::cuda::set_device(c10::DeviceIndex(assigned.device_index));
  return c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(assigned.device_index));
}

model::ModelOptions model_options(const recipe::Recipe& r, const recipe::MeshShape& mesh, c10::Device device,
                                  const mesh::ProcessGroups& groups, const PipelinePlan& pipeline) {
  model::ModelOptions options;
  options.chunks = pipeline.chunks;
  options.tp = {groups.coordinates().tp, groups.layout().shape().tp, &groups.get(mesh::GroupKind::Tp),
                r.parallel.sequence_parallel, r.parallel.tp_comm_overlap};
  options.cp = {groups.coordinates().cp, groups.layout().shape().cp, &groups.get(mesh::GroupKind::Cp),
                r.parallel.cp_method == recipe::CpMethod::Ulysses ? model::ContextParallel::Method::Ulysses
                                                  : model::ContextParallel::Method::Ring};
  // MoE layers under tp need sequence parallelism (validated): tp x cp ranks share a micro-batch.
  options.ep = {groups.coordinates().ep, groups.layout().shape().ep, &groups.get(mesh::GroupKind::Ep),
                &groups.get(mesh::GroupKind::TpCp), &groups.get(mesh::GroupKind::TpDpCp),
                {groups.coordinates().etp, groups.layout().shape().etp, &groups.get(mesh::GroupKind::Etp)}};
  if (r.model.moe) {
    // The load-balancing loss of each micro-batch averaged over the step's micro-batches and dp;
    // in the global-batch scope one loss per time slot (its parts spread over dp), averaged over
    // the slots.
    const bool global = r.model.moe->aux_loss_scope == recipe::AuxLossScope::GlobalBatch;
    options.aux_loss_scale =
        r.model.moe->router_aux_loss_coef / double(mesh.grad_accum_steps * (global ? 1 : mesh.dp));
    options.z_loss_scale = r.model.moe->router_z_loss_coef / double(mesh.grad_accum_steps * mesh.dp);
  }
  options.config = r.model;
  options.seed = uint64_t(r.training.seed);
  options.dtype = r.training.dtype == recipe::Precision::BF16 ? at::kBFloat16 : at::kFloat;
  options.device = device;
  options.recompute = r.training.recompute;
  options.kernels = model::FusedKernels::from(r.training.fused_kernels);
  // ZeRO-3 (over more than one rank): parameters are created without memory and written straight
  // into this rank's shards (OptimizerDriver), so no rank ever holds the whole model.
  options.deferred_parameters = r.parallel.zero >= 3 && mesh.dp * mesh.cp > 1;
  return options;
}

// Room for a checkpoint: parameters in their dtype, two fp32 Adam moments and fp32 master weights
// for bf16 (this rank's part), checked before any step.
void check_checkpoint_room(const recipe::Recipe& r, const model::Transformer& model, const mesh::ProcessGroups& groups) {
  if (!r.checkpoint.dir) return;
  uint64_t elements = 0;
  for (const auto& p : model.parameters().all()) elements += uint64_t(p.real_numel());  // padding rows are never saved
  const uint64_t per_element = (r.training.dtype == recipe::Precision::BF16 ? 2 + 4 : 4) + 8;
  const int64_t shards = std::max<int64_t>(1, groups.get(mesh::GroupKind::DpCp).size());
  checkpoint::check_checkpoint_dir(*r.checkpoint.dir, groups.global_rank(), elements * per_element / uint64_t(shards));
}

// The optimizer step of `figures`' gradients: clip, wait for a checkpoint snapshot in flight, update.
void update(OptimizerDriver& optimizer, Checkpointing& checkpointing, const recipe::Recipe& r, double lr,
            StepFigures& figures, const std::atomic<int64_t>& wait_ns) {
  StepTimes& times = figures.times;
  PhaseClock phase(wait_ns);
  optimizer.clip(r.training.grad_clip, figures.grad_norm);
  phase.lap(&times.optimizer_s, &times.comm_wait_s);
  checkpointing.fence();
  phase.lap(&times.checkpoint_s, &times.comm_wait_s);
  optimizer.step(lr);
  phase.lap(&times.optimizer_s, &times.comm_wait_s);
}

// Each group's collective waits since the previous step.
void count_waits_by_group(const comm::CommContext& context, std::map<std::string, int64_t>& before, StepTimes& times) {
  const auto waits = context.waits_by_group();
  for (const auto& [group, ns] : waits) times.comm_wait_by_group_s[group] = double(ns - before[group]) * 1e-9;
  before = waits;
}

// Steps until training.steps, or until a stop on a signal (returns false then): compute -> clip ->
// update, then the observers in order.
bool run_steps(const recipe::LoadedRecipe& loaded, mesh::ProcessGroups& groups, TrainStep& step,
               OptimizerDriver& optimizer, Checkpointing& checkpointing, const std::vector<StepObserver*>& observers,
               Progress& progress) {
  const recipe::Recipe& r = loaded.recipe;
  const std::atomic<int64_t>& wait_ns = groups.context().wait_ns;
  std::map<std::string, int64_t> waits_logged = groups.context().waits_by_group();
  while (progress.step < r.training.steps) {
    groups.context().step = progress.step + 1;
    const double lr = optim::learning_rate(r.optimizer, r.training.steps, progress.step);
    optimizer.zero_grad();
    for (StepObserver* o : observers) o->before_step(progress.step + 1);
    StepFigures figures = step.compute_gradients(progress.consumed_samples);
    update(optimizer, checkpointing, r, lr, figures, wait_ns);
    figures.times += checkpointing.take_time();  // the previous step's save
    count_waits_by_group(groups.context(), waits_logged, figures.times);
    progress.step += 1;
    progress.consumed_samples += loaded.mesh->global_batch_size;

    StepEnd end{.step = progress.step,
                .lr = lr,
                .figures = figures,
                .overlap = optimizer.overlap(),
                .last = progress.step == r.training.steps,
                .interval_save = r.checkpoint.interval > 0 && progress.step % r.checkpoint.interval == 0,
                .stopping = false,
                .reading = std::nullopt,
                .straggler = nullptr,
                .stop = false};
    for (StepObserver* o : observers) {
      o->after_step(end);
      if (end.stop) return false;
    }
    for (StepObserver* o : observers) o->end_of_step(end);
  }
  return true;
}

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& loaded, mesh::ProcessGroups& groups, const TrainOptions& options) {
  const recipe::Recipe& r = loaded.recipe;
  const recipe::MeshShape& mesh = loaded.mesh.value();
  std::optional<RunPlan> cpu_plan;
  const RunPlan& plan = options.plan ? *options.plan : cpu_plan.emplace(plan_run(loaded, runtime::DeviceAssignment{}));
  const c10::Device device = training_device(plan.device);
  // Data first: bad files are user errors and must come before any heavy work.
  const std::unique_ptr<data::Dataset> dataset = data::open_dataset(r);
  const std::unique_ptr<data::Dataset> held_out = r.evaluation.interval > 0 ? data::open_evaluation_dataset(r) : nullptr;

  const PipelinePlan pipeline = plan_pipeline(plan.pipeline, groups.coordinates().pp);
  // `run` refused these before starting (app/cmd_run.cpp); a caller that did not ask gets the same.
  if (!plan.support_problems.empty()) throw UserError(plan.support_problems.front());
  model::Transformer model(model_options(r, mesh, device, groups, pipeline));
  OptimizerDriver optimizer(model, r, groups);
  check_checkpoint_room(r, model, groups);
  StepLog log(loaded, device, groups.global_rank() == 0 ? options.log : nullptr);
  // Times steps from here. A run saves checkpoints exactly when it has a checkpoint.dir
  // (CheckpointSaver::enabled), and then the figures are read before each save.
  StepReader reader(loaded, device, /*checkpoints=*/r.checkpoint.dir.has_value());
  auto say = [&log](const std::string& line) { log.say(line); };
  const RunStart start = prepare_run_start(loaded, model, optimizer, say);
  if (start.finished) return *start.finished;
  Progress progress = start.progress;
  log.print_opening(*dataset, optimizer.describe());

  PeriodicEvaluation evaluation(model, held_out.get(), loaded, groups, pipeline, device, log);
  const std::atomic<int64_t>& wait_ns = groups.context().wait_ns;
  Checkpointing checkpointing(loaded, groups, say, [&] {
    optimizer.wait_parameter_gathers();  // the parameters hold the update before they are captured
    auto content = capture_training_state(model, optimizer.checkpoint_records(), optimizer.steps_taken(), loaded,
                                          progress, groups, optimizer.parameter_records());
    if (const model::RoutingBias* bias = model.routing_bias()) content.extra["moe_routing_bias"] = bias->to_json();
    if (const auto& last = evaluation.last())
      content.extra["evaluation"] = {{"loss", last->loss}, {"perplexity", last->perplexity}};
    return content;
  }, options.claim, wait_ns);
  TrainStep step(model, optimizer, *dataset, r, mesh, groups, pipeline, device);
  StopVote stop_vote(groups.world(), device, progress.step, r.training.steps);
  StragglerWatch straggler(r.logging, groups, device);  // a collective on every rank (when on)
  if (!straggler.on() && device.is_cuda() && r.logging.straggler_intervals > 0 && groups.world().size() > 1)
    say("straggler attribution: off on GPUs until collective waits are timed on the device (host times cannot tell "
        "who is slow there; docs/observability.md#stragglers)");
  if (groups.global_rank() == 0) runtime::StopSignal::enable_acknowledgement(checkpointing.enabled());
  RoutingBiasUpdate bias_update(model, r);
  DivergenceCheck divergence(model, r);
  Profiling profiling(r.profiling, groups.global_rank(), device.is_cuda(), say);
  const std::vector<StepObserver*> observers = {&bias_update, &stop_vote,  &reader,        &straggler, &log,
                                                &divergence,  &evaluation, &checkpointing, &profiling};
  TrainSummary summary;
  summary.first_step = progress.step;
  summary.stopped_by_signal = !run_steps(loaded, groups, step, optimizer, checkpointing, observers, progress);
  if (summary.stopped_by_signal) profiling.close_step();
  optimizer.wait_parameter_gathers();
  summary.steps_completed = progress.step;
  summary.last_loss = reader.last_loss();
  summary.last_checkpoint = checkpointing.finish();
  return summary;
}

}  // namespace trainer::train
