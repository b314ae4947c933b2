#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>

#include <optional>

#include <stdexcept>

#include "checkpoint/dir_check.h"
#include "core/error.h"
#include "checkpoint/dir_claim.h"
#include "data/dataset.h"
#include "metrics/cpu_memory.h"
#include "model/transformer.h"
#include "optim/lr_schedule.h"
#include "train/checkpoint_saver.h"
#include "train/step_profiler.h"
#include "runtime/trace_scope.h"
#include "train/evaluation.h"
#include "parallel/gpu_support.h"
#include "runtime/stop_signal.h"
#include "train/optimizer_driver.h"
#include "train/run_start.h"
#include "train/step_log.h"
#include "train/stop_vote.h"
#include "train/train_step.h"
#include "train/training_state.h"

namespace trainer::train {

namespace {

c10::Device training_device(const TrainOptions& options) {
  if (options.gpu < 0) {
    metrics::CpuMemoryTracker::install();
    return c10::Device(c10::DeviceType::CPU);
  }
  c10::cuda::set_device(c10::DeviceIndex(options.gpu));
  return c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(options.gpu));
}

model::ModelOptions model_options(const recipe::Recipe& r, const recipe::MeshShape& mesh, c10::Device device,
                                  const mesh::ProcessGroups& groups, const PipelinePlan& pipeline) {
  model::ModelOptions options;
  options.chunks = pipeline.chunks;
  options.tp = {groups.coordinates().tp, groups.layout().shape().tp, &groups.get(mesh::GroupKind::Tp),
                r.parallel.sequence_parallel};
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

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& loaded, mesh::ProcessGroups& groups, const TrainOptions& options) {
  const recipe::Recipe& r = loaded.recipe;
  const recipe::MeshShape& mesh = loaded.mesh.value();
  const c10::Device device = training_device(options);
  // Data first: bad files are user errors and must come before any heavy work.
  const std::unique_ptr<data::Dataset> dataset = data::open_dataset(r);
  const std::unique_ptr<data::Dataset> held_out = r.evaluation.interval > 0 ? data::open_evaluation_dataset(r) : nullptr;

  const PipelinePlan pipeline = plan_pipeline(r, mesh, groups.coordinates().pp);
  // `run` refused these before starting (app/cmd_run.cpp); a caller that did not ask gets the same.
  if (device.is_cuda())
    if (const auto problems = parallel::gpu_support_problems(r, mesh); !problems.empty()) throw UserError(problems.front());
  model::Transformer model(model_options(r, mesh, device, groups, pipeline));
  OptimizerDriver optimizer(model, r, groups);
  check_checkpoint_room(r, model, groups);
  StepLog log(loaded, model, device, groups.global_rank() == 0 ? options.log : nullptr);
  auto say = [&log](const std::string& line) { log.say(line); };
  const RunStart start = prepare_run_start(loaded, model, optimizer, say);
  if (start.finished) return *start.finished;
  Progress progress = start.progress;
  log.print_opening(*dataset, optimizer.describe());

  CheckpointSaver saver(loaded, groups, say);
  std::optional<EvaluationResult> last_evaluation;
  auto state = [&] {
    optimizer.wait_parameter_gathers();  // the parameters hold the update before they are captured
    auto content = capture_training_state(model, optimizer.checkpoint_records(), optimizer.steps_taken(), loaded,
                                          progress, groups, optimizer.parameter_records());
    if (const model::RoutingBias* bias = model.routing_bias()) content.extra["moe_routing_bias"] = bias->to_json();
    if (last_evaluation)
      content.extra["evaluation"] = {{"loss", last_evaluation->loss}, {"perplexity", last_evaluation->perplexity}};
    return content;
  };
  saver.reserve(state());
  TrainStep step(model, optimizer, *dataset, r, mesh, groups, pipeline, device);
  StopVote stop_vote(groups.world(), device);
  TrainSummary summary;
  summary.first_step = progress.step;
  const std::atomic<int64_t>& wait_ns = groups.context().wait_ns;
  StepTimes saving;  // checkpoint time after a step's log: counted in the next step's figures
  std::map<std::string, int64_t> waits_logged = groups.context().waits_by_group();
  StepProfiler profiler(r.profiling, groups.global_rank(), device.is_cuda());
  // A stop signal is acknowledged at once (by rank 0), naming the step the stop vote will end on:
  // one posted during step s is read at step s + 1 (stop_vote.h).
  auto publish_stop_step = [&] { runtime::StopSignal::set_stop_step(std::min(progress.step + 2, r.training.steps)); };
  publish_stop_step();
  if (groups.global_rank() == 0) runtime::StopSignal::enable_acknowledgement(saver.enabled());
  while (progress.step < r.training.steps) {
    groups.context().step = progress.step + 1;
    const double lr = optim::learning_rate(r.optimizer, r.training.steps, progress.step);
    optimizer.zero_grad();
    profiler.before_step(progress.step + 1);
    std::optional<runtime::TraceScope> step_scope;  // the step in profiler traces, up to its checkpoint
    step_scope.emplace(fmt::format("step {}", progress.step + 1));  // once a step: formatted always
    StepFigures figures = step.compute_gradients(progress.consumed_samples);
    StepTimes& times = figures.times;
    PhaseClock phase(wait_ns);
    optimizer.clip(r.training.grad_clip, figures.grad_norm);
    phase.lap(&times.optimizer_s, &times.comm_wait_s);
    saver.fence();
    phase.lap(&times.checkpoint_s, &times.comm_wait_s);
    optimizer.step(lr);
    phase.lap(&times.optimizer_s, &times.comm_wait_s);
    times += saving;
    saving = StepTimes{};
    const auto waits = groups.context().waits_by_group();
    for (const auto& [group, ns] : waits) times.comm_wait_by_group_s[group] = double(ns - waits_logged[group]) * 1e-9;
    waits_logged = waits;
    // Auxiliary-loss-free balancing: every rank moves the same biases by the step's loads.
    if (model::RoutingBias* bias = model.routing_bias()) bias->update(figures.moe_load, r.model.moe->bias_update_rate);
    progress.step += 1;
    progress.consumed_samples += mesh.global_batch_size;

    const bool last = progress.step == r.training.steps;
    const bool stopping = stop_vote.poll();
    publish_stop_step();
    const bool interval_save = r.checkpoint.interval > 0 && progress.step % r.checkpoint.interval == 0;
    // Figures are read (and checked for divergence) before anything is saved.
    log.after_step(progress.step, lr, figures, optimizer.overlap(), stopping || (saver.enabled() && interval_save));
    if (held_out && (progress.step % r.evaluation.interval == 0 || last || stopping)) {
      last_evaluation = evaluate(model, *held_out, r, mesh, groups, pipeline, device);
      log.evaluation(progress.step, *last_evaluation);
    }
    if (options.claim && options.claim->lost())
      throw TrainingFailure(fmt::format("checkpoint.dir {} was taken over by {}; this job stops without writing "
                                        "another checkpoint",
                                        *r.checkpoint.dir, options.claim->lost_to()));
    if (stopping) {
      say(fmt::format("stopping after step {} on a signal", progress.step));
      saver.save(state(), progress.step, "on stop", false);
      summary.stopped_by_signal = true;
      break;
    }
    phase.restart();
    if (last)
      saver.save(state(), progress.step, "final", false);
    else if (interval_save)
      saver.save(state(), progress.step, "interval", true);
    phase.lap(&saving.checkpoint_s, &saving.comm_wait_s);
    step_scope.reset();
    if (const auto trace = profiler.after_step(progress.step))
      say(fmt::format("profile of steps {}-{}: one trace per rank in {} (rank 0: {})", r.profiling.steps[0],
                      r.profiling.steps[1], r.profiling.dir.value_or(""), *trace));
    saver.report_committed();
  }
  optimizer.wait_parameter_gathers();
  summary.steps_completed = progress.step;
  summary.last_loss = log.last_loss();
  summary.last_checkpoint = saver.finish();
  return summary;
}

}  // namespace trainer::train
