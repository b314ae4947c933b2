#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>


#include <chrono>
#include <cmath>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/commit_channel.h"
#include "checkpoint/dir_check.h"
#include "checkpoint/dir_claim.h"
#include "core/error.h"
#include "core/plural.h"
#include "data/dataset.h"
#include "estimate/estimate.h"
#include "estimate/hardware.h"
#include "estimate/model_counts.h"
#include "metrics/cpu_memory.h"
#include "metrics/cuda_memory.h"
#include "metrics/gpu_peaks.h"
#include "metrics/human_format.h"
#include "metrics/metrics_file.h"
#include "metrics/step_metrics.h"
#include "metrics/throughput.h"
#include "model/transformer.h"
#include "optim/lr_schedule.h"
#include "recipe/recipe_diff.h"
#include "runtime/stop_signal.h"
#include "train/batch.h"
#include "train/optimizer_driver.h"
#include "train/training_state.h"

namespace trainer::train {

namespace {

using Clock = std::chrono::steady_clock;

std::string first_non_finite_gradient(model::Transformer& model) {
  for (const auto& p : model.parameters().all()) {
    const at::Tensor& g = p.tensor.grad();
    if (g.defined() && !at::isfinite(g).all().item<bool>()) return p.name;
  }
  return "none on this rank";
}

std::optional<std::string> resume_path(const recipe::Recipe& r) {
  const auto& c = r.checkpoint;
  if (c.resume == "none") return std::nullopt;
  if (c.resume == "auto") return c.dir ? checkpoint::find_latest_checkpoint(*c.dir) : std::nullopt;
  return c.resume;
}

}  // namespace

TrainSummary train(const recipe::LoadedRecipe& loaded, mesh::ProcessGroups& groups, const TrainOptions& options) {
  const recipe::Recipe& r = loaded.recipe;
  const recipe::MeshShape& mesh = loaded.mesh.value();
  comm::Communicator& dp = groups.get(mesh::GroupKind::Dp);
  comm::Communicator& world = groups.world();
  const bool rank0 = groups.global_rank() == 0;
  FILE* log = rank0 ? options.log : nullptr;
  auto say = [&](const std::string& line) {
    if (!log) return;
    std::fputs((line + "\n").c_str(), log);
    std::fflush(log);
  };

  const bool on_gpu = !options.force_cpu && at::hasCUDA() && options.local_rank < int64_t(at::getNumGPUs());
  const c10::Device device =
      on_gpu ? c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(options.local_rank)) : c10::Device(c10::DeviceType::CPU);
  if (on_gpu) c10::cuda::set_device(c10::DeviceIndex(options.local_rank));
  if (!on_gpu) metrics::CpuMemoryTracker::install();

  // Data first: bad files are user errors and must come before any heavy work.
  const std::unique_ptr<data::Dataset> dataset = data::open_dataset(r);

  model::ModelOptions model_options;
  model_options.config = r.model;
  model_options.seed = uint64_t(r.training.seed);
  model_options.dtype = r.training.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  model_options.device = device;
  model_options.recompute = model::parse_recompute(r.training.recompute);
  model::Transformer model(model_options);
  OptimizerDriver optimizer(model, r, dp);
  if (r.checkpoint.dir) {
    // Parameters in their dtype, two fp32 Adam moments and fp32 master weights for bf16: this rank's part.
    uint64_t elements = 0;
    for (const auto& p : model.parameters().all()) elements += uint64_t(p.tensor.numel());
    const uint64_t per_element = (r.training.dtype == "bf16" ? 2 + 4 : 4) + 8;
    checkpoint::check_checkpoint_dir(*r.checkpoint.dir, groups.global_rank(),
                                     elements * per_element / uint64_t(std::max<int64_t>(1, mesh.dp)));
  }

  Progress progress;
  const auto resume_from = resume_path(r);
  if (!resume_from && r.model.init_from) {
    const int64_t loaded_count = load_hf_weights(*r.model.init_from, model);
    say(fmt::format("initialised {} parameters from Hugging Face weights in {}", loaded_count, *r.model.init_from));
  }
  if (const auto& path = resume_from) {
    const checkpoint::LoadedCheckpoint checkpoint(*path);
    if (checkpoint.step() >= r.training.steps) {
      // Re-running a finished run: say so instead of "finished after step 200 of 60".
      say(fmt::format("nothing to train: checkpoint {} is at step {}, which is not before training.steps={}; raise "
                      "training.steps to train further, or set checkpoint.resume=none to start over",
                      checkpoint.path(), checkpoint.step(), r.training.steps));
      TrainSummary done;
      done.first_step = done.steps_completed = checkpoint.step();
      done.nothing_to_do = true;
      done.last_checkpoint = checkpoint.path();
      return done;
    }
    progress = restore_model(checkpoint, model);
    optimizer.load_state(optimizer_state_reader(checkpoint),
                               checkpoint.manifest().at("extra").value("optimizer_steps", checkpoint.step()));
    say(fmt::format("resumed from {} at step {} ({} samples consumed)", checkpoint.path(), progress.step,
                    progress.consumed_samples));
    // A changed recipe is allowed (a longer run, another mesh), but never silently.
    if (r.model.init_from)
      say(fmt::format("model.init_from {} is ignored: the run resumes from the checkpoint (set checkpoint.resume=none "
                      "to start from those weights)", *r.model.init_from));
    if (checkpoint.manifest().contains("recipe")) {
      const auto changes = recipe::recipe_differences(checkpoint.manifest().at("recipe"), loaded.resolved);
      if (!changes.empty()) {
        std::string list;
        for (size_t i = 0; i < changes.size() && i < 8; ++i) list += "\n  " + changes[i];
        if (changes.size() > 8) list += fmt::format("\n  ... and {} more", changes.size() - 8);
        say(fmt::format("this recipe differs from the checkpoint's in {} value{} (checkpoint -> now; now wins, the "
                        "learning-rate schedule included):{}",
                        changes.size(), changes.size() == 1 ? "" : "s", list));
      }
    }
  }

  const estimate::ModelCounts counts = estimate::count_model(r.model, r.training.seq_len);
  std::optional<double> peak_tflops;
  std::string device_name = "CPU";
  if (on_gpu) {
    device_name = at::cuda::getDeviceProperties(device.index())->name;
    if (auto gpu = metrics::gpu_peak_for_device_name(device_name))
      peak_tflops = metrics::dense_peak_tflops(*gpu, r.training.dtype);
  }
  // What the estimator predicts for this very run (torch-free, the same code as `trainer estimate`),
  // printed beside the measurements after the first logged step.
  std::optional<estimate::HardwareProfile> profile;
  if (on_gpu)
    if (auto gpu = metrics::gpu_peak_for_device_name(device_name)) {
      try {
        profile = estimate::builtin_profile(gpu->key);
      } catch (const std::exception&) {
      }
    }
  estimate::EstimateOptions estimate_options;
  estimate_options.cpu_threads = at::get_num_threads();
  const estimate::JobEstimate predicted =
      estimate::estimate_job(r, mesh, profile ? &*profile : nullptr, estimate_options);
  bool compared = false;
  const int64_t seq_len = r.training.seq_len;
  const int64_t global_tokens = mesh.global_batch_size * seq_len;
  const std::optional<double> floor = dataset->entropy_floor();
  say(fmt::format("model: {} parameters ({} active), {} FLOPs/token | data: {} | device: {} {} x {} | global batch "
                  "{} x {} tokens ({} of {} per rank) | {}",
                  metrics::format_count(double(counts.total_params)), metrics::format_count(double(counts.active_params)),
                  metrics::format_count(counts.flops_per_token), dataset->describe(), mesh.world_size, device_name,
                  r.training.dtype, mesh.global_batch_size, seq_len,
                  count_of(mesh.grad_accum_steps, "micro-batch", "micro-batches"), r.training.micro_batch_size,
                  optimizer.describe()));
  if (floor) say(fmt::format("loss floor of this data: {:.4f} nats/token", *floor));

  std::unique_ptr<metrics::MetricsFile> metrics_file;
  if (rank0 && r.logging.metrics_file) metrics_file = std::make_unique<metrics::MetricsFile>(*r.logging.metrics_file);

  auto reset_peak_memory = [on_gpu] {
    if (on_gpu)
      metrics::reset_cuda_peak_memory();
    else
      metrics::CpuMemoryTracker::reset_peak();
  };
  reset_peak_memory();
  TrainSummary summary;
  summary.first_step = progress.step;
  const double aux_coef = r.model.moe ? r.model.moe->router_aux_loss_coef : 0.0;
  const auto run_start = Clock::now();
  double time_in_steps = 0;
  int64_t steps_this_run = 0;

  // Every rank writes its part of each checkpoint (no collective); rank 0 commits it once all
  // parts are durable. Asynchronous saves block training only until the snapshot is taken, at
  // the latest before the next optimizer step (checkpoint_writer.h).
  std::unique_ptr<checkpoint::CheckpointWriter> writer;
  if (r.checkpoint.dir) {
    checkpoint::WriterOptions writer_options;
    writer_options.dir = *r.checkpoint.dir;
    writer_options.keep = r.checkpoint.keep;
    writer_options.async = r.checkpoint.async;
    if (groups.store() && mesh.world_size > 1)
      writer_options.channel = checkpoint::store_channel(
          groups.store(), groups.global_rank(), mesh.world_size,
          std::chrono::seconds(int64_t(std::ceil(r.parallel.collective_timeout_s))));
    writer = std::make_unique<checkpoint::CheckpointWriter>(std::move(writer_options));
    writer->reserve(capture_training_state(model, optimizer.checkpoint_records(), optimizer.steps_taken(), loaded,
                                           progress, groups.coordinates().dp, mesh.dp));
  }
  struct PendingSnapshot {
    int64_t step = 0;
    std::string why;
    double previous_s = 0;  // waiting for the previous save's write (one save in flight at a time)
    double start_s = 0;
  };
  std::optional<PendingSnapshot> pending;  // an asynchronous save whose snapshot training may still wait for
  auto save = [&](const char* why, bool more_steps) {
    if (!writer) return;
    const auto t0 = Clock::now();
    writer->wait();  // timed apart: a previous write still running is the disk's cost, not the snapshot's
    const auto t1 = Clock::now();
    writer->save(capture_training_state(model, optimizer.checkpoint_records(), optimizer.steps_taken(), loaded,
                                        progress, groups.coordinates().dp, mesh.dp));
    const double previous = std::chrono::duration<double>(t1 - t0).count();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!r.checkpoint.async)
      say(fmt::format("checkpoint of step {} ({}): training paused {:.4f} s", progress.step, why, seconds));
    else if (more_steps)
      pending = PendingSnapshot{progress.step, why, previous, seconds - previous};
    else
      say(fmt::format("checkpoint of step {} ({}): training paused {:.4f} s, writing in the background",
                      progress.step, why, seconds));
  };
  // Before the optimizer changes parameters and state: the snapshot of a save in flight must be complete.
  auto snapshot_fence = [&] {
    if (!pending) return;
    const double waited = writer->before_parameter_update();
    say(fmt::format("checkpoint of step {} ({}): training paused {:.4f} s ({:.4f} s waiting for the previous save's "
                    "write, {:.4f} s starting the snapshot, {:.4f} s waiting for it before the next optimizer step), "
                    "writing in the background",
                    pending->step, pending->why, pending->previous_s + pending->start_s + waited, pending->previous_s,
                    pending->start_s, waited));
    pending.reset();
  };

  // Small reductions live on the training device (NCCL needs GPU tensors); double on the CPU for
  // exact sums, float on a GPU.
  const auto scalars = at::TensorOptions().dtype(on_gpu ? at::kFloat : at::kDouble).device(device);
  while (progress.step < r.training.steps) {
    const auto step_start = Clock::now();
    const int64_t step = progress.step;
    groups.context().step = step + 1;
    const double lr = optim::learning_rate(r.optimizer, r.training.steps, step);

    optimizer.begin_step();
    double loss_sum = 0, aux_sum = 0;
    for (int64_t micro = 0; micro < mesh.grad_accum_steps; ++micro) {
      const uint64_t first = first_sample_of(uint64_t(progress.consumed_samples), groups.coordinates().dp,
                                             mesh.grad_accum_steps, micro, r.training.micro_batch_size);
      const MicroBatch batch = make_micro_batch(*dataset, first, r.training.micro_batch_size, seq_len, device);
      const model::ForwardOutput out = model.forward(batch.inputs, batch.targets);
      at::Tensor loss = out.loss_sum / double(global_tokens);
      if (aux_coef > 0) loss = loss + out.aux_loss * (aux_coef / double(mesh.grad_accum_steps * mesh.dp));
      optimizer.begin_micro_batch(micro + 1 == mesh.grad_accum_steps);
      loss.backward();
      optimizer.end_micro_batch();
      loss_sum += out.loss_sum.item<double>();
      aux_sum += out.aux_loss.item<double>();
    }
    optimizer.finish_gradients();
    // The step's loss over all data-parallel ranks, and whether any rank was asked to stop.
    at::Tensor totals = at::tensor({loss_sum, aux_sum}, scalars);
    dp.all_reduce(totals, comm::ReduceOp::Sum)->wait();
    at::Tensor stop = at::tensor({runtime::StopSignal::requested() ? 1.0 : 0.0}, scalars);
    world.all_reduce(stop, comm::ReduceOp::Max)->wait();
    const double step_loss = totals[0].item<double>() / double(global_tokens);
    const double step_aux = totals[1].item<double>() / double(mesh.grad_accum_steps * mesh.dp);
    const double grad_norm = optimizer.grad_norm();
    if (!std::isfinite(step_loss) || !std::isfinite(grad_norm)) {
      // The step's figures reach the console and the metrics file before the run stops.
      metrics::StepMetrics m;
      m.step = step + 1;
      m.total_steps = r.training.steps;
      m.loss = step_loss;
      m.lr = lr;
      m.grad_norm = grad_norm;
      m.time_s = std::chrono::duration<double>(Clock::now() - step_start).count();
      say(metrics::format_console_line(m));
      if (metrics_file) metrics_file->write(m);
      const bool loss_bad = !std::isfinite(step_loss);
      throw TrainingFailure(fmt::format(
          "step {}: the {} is {}{}; training diverged and stops (the last checkpoint is intact). Try a lower "
          "optimizer.lr or a longer optimizer.warmup_steps, training.grad_clip, checking the data for bad tokens{}",
          step + 1, loss_bad ? "loss" : "gradient norm", loss_bad ? step_loss : grad_norm,
          loss_bad ? "" : fmt::format(" (first non-finite gradient: {})", first_non_finite_gradient(model)),
          r.training.dtype == "bf16" ? ", or training.dtype fp32 to rule out a bf16 overflow" : ""));
    }
    optimizer.clip(r.training.grad_clip, grad_norm);
    snapshot_fence();
    optimizer.step(lr);
    optimizer.zero_grad();
    progress.step += 1;
    progress.consumed_samples += mesh.global_batch_size;
    if (on_gpu) c10::cuda::device_synchronize();
    const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
    time_in_steps += seconds;
    ++steps_this_run;
    summary.last_loss = step_loss;

    if (progress.step % r.logging.interval == 0 || progress.step == r.training.steps) {
      metrics::StepMetrics m;
      m.step = progress.step;
      m.total_steps = r.training.steps;
      m.loss = step_loss;
      m.lr = lr;
      m.grad_norm = grad_norm;
      const auto throughput =
          metrics::measure_throughput(global_tokens, seconds, counts.flops_per_token, mesh.world_size, peak_tflops);
      m.tokens_per_s = throughput.tokens_per_s;
      m.tflops_per_device = throughput.tflops_per_device;
      m.mfu = throughput.mfu;
      m.mem_peak_bytes =
          on_gpu ? metrics::cuda_memory_stats().peak_allocated_bytes : metrics::CpuMemoryTracker::peak_bytes();
      m.time_s = seconds;
      m.eta_s = time_in_steps / double(steps_this_run) * double(r.training.steps - progress.step);
      m.extra = {{"elapsed_s", std::chrono::duration<double>(Clock::now() - run_start).count()},
                 {"consumed_samples", progress.consumed_samples}};
      if (r.model.moe) m.extra["aux_loss"] = step_aux;
      if (floor) m.extra["loss_floor"] = *floor;
      m.extra["mem_predicted_bytes"] = int64_t(predicted.peak_bytes);
      m.extra["step_time_predicted_s"] = predicted.has_time ? nlohmann::json(predicted.step_time_s) : nlohmann::json();
      if (const auto* overlap = optimizer.overlap())
        m.extra["dp_overlap"] = {{"buckets", overlap->buckets},
                                 {"launched_in_backward", overlap->launched_in_backward},
                                 {"first_launch_s", overlap->first_launch_s},
                                 {"backward_end_s", overlap->backward_end_s}};
      say(metrics::format_console_line(m));
      if (!compared) {
        compared = true;
        say(fmt::format("predicted vs measured (rank 0): peak tensor memory {} vs {} ({:+.1f}%); step time {}",
                        metrics::format_bytes(int64_t(predicted.peak_bytes)), metrics::format_bytes(m.mem_peak_bytes),
                        100.0 * (predicted.peak_bytes - double(m.mem_peak_bytes)) / double(std::max<int64_t>(1, m.mem_peak_bytes)),
                        predicted.has_time ? fmt::format("{:.3f} s vs {:.3f} s", predicted.step_time_s, seconds)
                                           : fmt::format("not predicted on the CPU (measured {:.3f} s)", seconds)));
      }
      if (metrics_file) metrics_file->write(m);
      reset_peak_memory();  // the next logged peak covers the steps since this line
    }

    if (options.claim && options.claim->lost())
      throw std::runtime_error(fmt::format("checkpoint.dir {} was taken over by {}; this job stops without writing "
                                           "another checkpoint", *r.checkpoint.dir, options.claim->lost_to()));
    if (stop.item<double>() > 0) {
      say(fmt::format("stopping after step {} on a signal", progress.step));
      save("on stop", false);
      summary.stopped_by_signal = true;
      break;
    }
    if (progress.step == r.training.steps)
      save("final", false);
    else if (r.checkpoint.interval > 0 && progress.step % r.checkpoint.interval == 0)
      save("interval", true);
    if (writer)
      if (const auto committed = writer->take_committed()) say(fmt::format("checkpoint {} committed", *committed));
  }
  summary.steps_completed = progress.step;
  if (writer) {
    summary.last_checkpoint = writer->wait();
    if (const auto committed = writer->take_committed()) say(fmt::format("checkpoint {} committed", *committed));
  }
  return summary;
}

}  // namespace trainer::train
