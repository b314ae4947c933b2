#include "estimate/report.h"
#include "core/plural.h"
#include "estimate/checkpoint_cost.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

namespace trainer::estimate {

namespace {

using nlohmann::json;

json number_or_null(bool present, double value) { return present ? json(value) : json(nullptr); }

json stage_json(const StageMemory& s) {
  return {
      {"stage", s.stage},
      {"layers", s.layers},
      {"moe_layers", s.moe_layers},
      {"peak_bytes", s.peak_allocated},
      {"peak_phase", s.peak_phase},
      {"reserved_bytes", s.reserved},
      {"device_total_bytes", s.device_total},
      {"breakdown",
       {{"parameters", s.parameters},
        {"gradients", s.gradients},
        {"optimizer_states", s.optimizer_states},
        {"model_buffers", s.model_buffers},
        {"cublas_workspace", s.cublas_workspace},
        {"activations_per_layer", {{"dense", s.activations_per_layer_dense}, {"moe", s.activations_per_layer_moe}}},
        {"activations_microbatch", s.activations_microbatch},
        {"inflight_chunks", s.inflight_chunks},
        {"inflight_microbatches", s.inflight_microbatches},
        {"activations_other_microbatches", s.activations_other_microbatches},
        {"microbatch_peak", s.microbatch_peak},
        {"microbatch_peak_at", s.microbatch_peak_at},
        {"logits_and_loss", s.logits_and_loss},
        {"logits_and_loss_peak", s.logits_and_loss_peak},
        {"optimizer_step_transient", s.optimizer_step_transient},
        {"zero2_full_buckets", s.zero2_full_buckets}, {"zero3_gathered", s.zero3_gathered}}},
  };
}

json time_json(const TimeBreakdown& t) {
  return {{"gemm_s", t.gemm_s},
          {"attention_s", t.attention_s},
          {"memory_bound_s", t.memory_bound_s},
          {"recompute_s", t.recompute_s},
          {"tp_comm_s", t.tp_comm_s},
          {"tp_hidden_s", t.tp_hidden_s},
          {"cp_comm_s", t.cp_comm_s},
          {"ep_comm_s", t.ep_comm_s},
          {"pp_comm_s", t.pp_comm_s},
          {"microbatch_s", t.microbatch_s},
          {"bubble_s", t.bubble_s},
          {"dp_comm_s", t.dp_comm_s},
          {"dp_exposed_s", t.dp_exposed_s},
          {"param_gather_s", t.param_gather_s},
          {"optimizer_s", t.optimizer_s},
          {"kernels", t.kernels},
          {"host_s", t.host_s},
          {"host_exposed_s", t.host_exposed_s}};
}

std::string count_text(double n) {
  if (n >= 1e12) return fmt::format("{:.2f}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

// 4.0 ms, 14.4 s, 42.7 min, 781.2 h.
std::string duration_text(double s) {
  if (s < 1) return seconds_text(s);
  if (s < 120) return fmt::format("{:.1f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

// A fraction as a percentage with three significant digits: 0.0911%, 8.89%.
std::string percent_text(double fraction) { return fmt::format("{:.3g}%", 100 * fraction); }

// Checkpoint cadence (checkpoint_cost.h, checkpoint_cadence.h): needs a step time.
struct Checkpoints {
  CheckpointCost cost;
  CadenceAdvice advice;
};

std::optional<Checkpoints> checkpoints_of(const JobEstimate& e, const ReportContext& c) {
  if (!c.recipe || !c.gpu || !e.has_time) return std::nullopt;
  Checkpoints k;
  k.cost = checkpoint_cost(*c.recipe, e, *c.gpu);
  k.advice = checkpoint_cadence(cadence_inputs(*c.recipe, e, k.cost));
  return k;
}

json checkpoints_json(const JobEstimate& e, const ReportContext& c) {
  const auto k = checkpoints_of(e, c);
  if (!k) return nullptr;
  const auto& ck = c.recipe->checkpoint;
  const auto& a = k->advice;
  const bool async = ck.async;
  return {{"enabled", ck.dir.has_value()},
          {"async", async},
          {"interval_steps", ck.interval},
          {"run_steps", c.recipe->training.steps},
          {"bytes_per_rank", k->cost.bytes_per_rank},
          {"snapshot_s", number_or_null(async, k->cost.snapshot_s)},
          {"hidden_s", number_or_null(async, k->cost.hidden_s)},
          {"write_s", k->cost.write_s},
          {"stall_s", k->cost.stall_s},
          {"min_interval_s", k->cost.min_interval_s},
          {"restart_s", k->cost.restart_s},
          {"gpu_mtbf_hours", c.recipe->hardware.gpu_mtbf_hours},
          {"job_mtbf_hours", a.job_mtbf_s / 3600},
          {"failures_per_run", a.failures_per_run},
          {"interval_s", a.interval_s},
          {"lost_per_failure_s", a.lost_per_failure_s},
          {"overhead", a.overhead},
          {"optimum_s", a.optimum_s},
          {"advised_interval_steps", a.advised_steps},
          {"advised_interval_s", a.advised_interval_s},
          {"advised_lost_per_failure_s", a.advised_lost_per_failure_s},
          {"advised_overhead", a.advised_overhead}};
}

std::string checkpoints_text(const JobEstimate& e, const ReportContext& c) {
  const auto k = checkpoints_of(e, c);
  if (!k) return c.gpu ? "" : "checkpoints: no cadence advice on the CPU (it needs a GPU step time)\n";
  const auto& ck = c.recipe->checkpoint;
  const auto& cost = k->cost;
  const auto& a = k->advice;
  const int64_t steps = c.recipe->training.steps;
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  const std::string per_rank = fmt::format("{} per rank", format_bytes(cost.bytes_per_rank));
  if (!ck.dir)
    line(fmt::format("checkpoints: off (checkpoint.dir is null): every failure loses the whole run so far ({} if "
                     "they were on)",
                     per_rank));
  else if (ck.interval == 0 || ck.interval >= steps)
    line(fmt::format("checkpoints: only at the end of the run (checkpoint.interval {}), {}, {}: a failure loses "
                     "about half the run",
                     ck.interval, ck.async ? "asynchronous" : "synchronous", per_rank));
  else
    line(fmt::format("checkpoints: every {} ({}), {}, {}", count_of(ck.interval, "step", "steps"),
                     duration_text(a.interval_s), ck.async ? "asynchronous" : "synchronous", per_rank));
  const double d2h = c.gpu->host_d2h_bytes_per_s / 1e9, storage = c.gpu->storage_bytes_per_s / 1e9;
  if (!ck.async)
    line(fmt::format("  stall per save {}: the write at {:.3g} GB/s per GPU (synchronous)", duration_text(cost.stall_s),
                     storage));
  else if (cost.snapshot_s <= cost.hidden_s)
    line(fmt::format("  stall per save {} (measured; the {} snapshot to host memory at {:.3g} GB/s hides behind the "
                     "next step's {}), then written in the background in {} at {:.3g} GB/s per GPU",
                     duration_text(cost.stall_s), duration_text(cost.snapshot_s), d2h, duration_text(cost.hidden_s),
                     duration_text(cost.write_s), storage));
  else
    line(fmt::format("  stall per save {} ({} measured + what the next step's {} does not hide of the {} snapshot to "
                     "host memory at {:.3g} GB/s), then written in the background in {} at {:.3g} GB/s per GPU",
                     duration_text(cost.stall_s), duration_text(kSnapshotStartS), duration_text(cost.hidden_s),
                     duration_text(cost.snapshot_s), d2h, duration_text(cost.write_s), storage));
  line(fmt::format("  failures: the job fails every {} ({} at {:g} h each, hardware.gpu_mtbf_hours): {:.3g} "
                   "failures expected in the run of {} ({})",
                   duration_text(a.job_mtbf_s), count_of(e.mesh.world_size, "GPU", "GPUs"),
                   c.recipe->hardware.gpu_mtbf_hours,
                   a.failures_per_run, count_of(steps, "step", "steps"), duration_text(a.run_s)));
  line(fmt::format("  work lost per failure: {} (half of {} + {} restart)", duration_text(a.lost_per_failure_s),
                   ck.dir && ck.interval > 0 && ck.interval < steps ? "the interval" : "the run",
                   duration_text(cost.restart_s)));
  const std::string advised =
      a.advised_steps >= steps
          ? fmt::format("saving only at the end (checkpoint.interval=0: the optimum, {} = {}, is longer than the run)",
                        count_of(a.advised_steps, "step", "steps"), duration_text(a.optimum_s))
          : fmt::format("every {} ({}; checkpoint.interval={})", count_of(a.advised_steps, "step", "steps"),
                        duration_text(a.advised_interval_s), a.advised_steps);
  const double young = young_interval_s(cost.stall_s, 0, a.job_mtbf_s);
  const std::string why =
      a.optimum_s > young * (1 + 1e-9)
          ? fmt::format("the background write's pace (Young's optimum sqrt(2 x stall x job MTBF) = {} would make each "
                        "save wait for the previous write)",
                        duration_text(young))
          : "Young's optimum sqrt(2 x stall x job MTBF)";
  line(fmt::format("  overhead (stalls + lost work + restarts): {} now; {} {}, {}{}", percent_text(a.overhead),
                   percent_text(a.advised_overhead), advised, why,
                   a.advised_overhead < a.overhead ? "" : "; no better than now"));
  return out;
}

}  // namespace

std::string format_bytes(double bytes) {
  const double a = std::fabs(bytes);
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.0f} B", bytes);
}

std::vector<std::string> estimate_assumptions(const JobEstimate& e, const ReportContext& c) {
  std::vector<std::string> a;
  a.push_back(
      "memory.peak_bytes is the allocator's peak allocated tensor bytes of the worst rank (what "
      "torch.cuda.max_memory_allocated and the CPU byte counter report), replayed from the tensors our "
      "implementation creates and autograd saves");
  if (c.gpu) {
    a.push_back(fmt::format("reserved = allocated x {:.2f} (caching-allocator fragmentation); device total adds {} "
                            "for the CUDA context, libraries and NCCL buffers",
                            c.gpu->fragmentation, format_bytes(c.gpu->framework_overhead_bytes)));
  } else {
    a.push_back("CPU (trainer run --cpu): memory only; per-thread attention buffers counted for 1 thread");
  }
  if (e.documents)
    a.push_back("documents: attention time is the documents' share of full causal attention on the rank with the "
                "most of it (ring attention: cp ranks assumed balanced by the document layout); each document's own "
                "kernel call is not counted; model FLOPs count only the attention inside documents, as the "
                "runtime's MFU");
  else if (e.documents_unknown)
    a.push_back("documents: data.document_masking without data.document_length_median/p99: attention counted as "
                "full causal attention (an upper bound)");
  if (e.counts.num_moe_layers > 0)
    a.push_back("MoE: peak_bytes assumes balanced routing (each expert gets its share of the rows); "
                "peak_bytes_worst_routing sends every token of the expert-parallel group to one rank's experts");
  if (c.recipe) {
    const auto& p = c.recipe->parallel;
    if (p.zero >= 2)
      a.push_back("ZeRO-2/3: gradient buckets reduce-scattered as they fill; ZeRO-3 gathers each layer before use "
                  "with the next one prefetched (docs/distributed.md)");
    if (c.recipe->model.moe && p.etp > 1)
      a.push_back("etp > 1 splits each expert's width by etp; each rank's experts compute on the rows of its "
                  "whole etp group (gathered and returned by all-to-all over etp)");
  }
  if (c.gpu) {
    if (c.fused_kernels) {
      a.push_back("time: memory-bound operations fused as torch.compile would (a third of the unfused ops' traffic "
                  "and launches; training.fused_kernels not applied)");
    } else {
      const auto& k = c.recipe ? c.recipe->training.fused_kernels : std::vector<recipe::FusedKernel>{};
      a.push_back(k.empty() ? std::string("time: memory-bound operations as the unfused ATen ops run them "
                                          "(training.fused_kernels is [])")
                            : fmt::format("time: memory-bound operations as the trainer runs them, with the fused "
                                          "kernels {} (training.fused_kernels)",
                                          fmt::join(k, ", ")));
    }
    a.push_back("time: model FLOPs per token 6N + 12 L H Q T (PaLM); attention executes half of its term (causal)");
    a.push_back(fmt::format(
        "checkpoints: failures independent at hardware.gpu_mtbf_hours per GPU; overhead to first order "
        "(stall / interval + (interval / 2 + restart) / job MTBF), optimum Young's sqrt(2 x stall x job MTBF); "
        "a save's stall {} (scripts/bench_ckpt) plus what of the snapshot copy the next step does not hide, or the "
        "whole write when synchronous; a restart {} (assumed) plus reading the checkpoint back",
        duration_text(kSnapshotStartS), duration_text(kRestartStartS)));
  }
  return a;
}

json estimate_json(const JobEstimate& e, const ReportContext& c) {
  const auto& m = e.mesh;
  json out;
  out["schema_version"] = kEstimateSchemaVersion;
  out["recipe"] = c.recipe_path;
  out["device"] = e.device;
  out["gpu"] = c.gpu ? profile_to_json(*c.gpu) : json(nullptr);
  out["world_size"] = m.world_size;
  out["gpus_per_node"] = c.recipe ? json(c.recipe->hardware.gpus_per_node) : json(nullptr);
  out["mesh"] = {{"tp", m.tp},   {"cp", m.cp},   {"dp", m.dp},   {"pp", m.pp},
                 {"vpp", m.vpp}, {"ep", m.ep},   {"etp", m.etp}, {"edp", m.edp},
                 {"global_batch_size", m.global_batch_size},
                 {"micro_batch_size", c.recipe ? json(c.recipe->training.micro_batch_size) : json(nullptr)},
                 {"microbatches", e.microbatches}};
  if (c.recipe) {
    const auto& p = c.recipe->parallel;
    const auto& t = c.recipe->training;
    out["parallel"] = {{"zero", p.zero},
                       {"sequence_parallel", p.sequence_parallel},
                       {"pipeline_schedule", e.schedule},
                       {"cp_method", recipe::name_of(p.cp_method)},
                       {"recompute", recipe::name_of(t.recompute)},
                       {"dtype", recipe::name_of(t.dtype)},
                       {"seq_len", t.seq_len}};
  }
  out["model"] = {{"parameters", e.counts.total_params},
                  {"active_parameters", e.counts.active_params},
                  {"flops_per_token", e.counts.flops_per_token}};
  json stages = json::array();
  for (const auto& s : e.stages) stages.push_back(stage_json(s));
  out["memory"] = {{"predicted", "allocated"},
                   {"peak_bytes", e.peak_bytes},
                   {"peak_bytes_worst_routing", e.peak_bytes_worst_routing},
                   {"worst_stage", e.worst_stage},
                   {"peak_phase", e.stages.at(size_t(e.worst_stage)).peak_phase},
                   {"reserved_bytes", e.reserved_bytes},
                   {"device_total_bytes", e.device_total_bytes},
                   {"capacity_bytes", number_or_null(c.gpu != nullptr, e.capacity_bytes)},
                   {"fits", c.gpu ? json(e.fits) : json(nullptr)},
                   {"fragmentation_factor", number_or_null(c.gpu != nullptr, c.gpu ? c.gpu->fragmentation : 0)},
                   {"framework_overhead_bytes",
                    number_or_null(c.gpu != nullptr, c.gpu ? c.gpu->framework_overhead_bytes : 0)},
                   {"stages", stages}};
  out["step_time_s"] = number_or_null(e.has_time, e.step_time_s);
  out["tokens_per_step"] = e.tokens_per_step;
  out["tokens_per_s"] = number_or_null(e.has_time, e.tokens_per_s);
  out["tokens_per_s_per_gpu"] = number_or_null(e.has_time, e.tokens_per_s_per_gpu);
  out["tflops_per_gpu"] = number_or_null(e.has_time, e.tflops_per_gpu);
  out["mfu"] = number_or_null(e.has_time, e.mfu);
  out["time"] = e.has_time ? json{{"fused_kernels", c.fused_kernels}, {"breakdown", time_json(e.time)}} : json(nullptr);
  out["documents"] = e.documents ? json{{"median", e.documents->median},
                                        {"p99", e.documents->p99},
                                        {"attention_work_fraction", e.documents->attention_fraction},
                                        {"max_over_mean_none", e.documents->imbalance_none},
                                        {"max_over_mean_cost", e.documents->imbalance_cost},
                                        {"global_batches_simulated", e.documents->global_batches}}
                                  : json(nullptr);
  out["checkpoints"] = checkpoints_json(e, c);
  out["assumptions"] = estimate_assumptions(e, c);
  return out;
}

std::string estimate_text(const JobEstimate& e, const ReportContext& c) {
  const auto& m = e.mesh;
  std::string out;
  auto line = [&](const std::string& s) { out += s + "\n"; };
  line(fmt::format("{}: {} parameters ({} active), {} FLOPs/token", c.recipe_path, count_text(double(e.counts.total_params)),
                   count_text(double(e.counts.active_params)), count_text(e.counts.flops_per_token)));
  line(fmt::format("mesh: world {} = tp {} x cp {} x dp {} x pp {} (vpp {}){}; experts etp {} x ep {} x edp {}{}",
                   m.world_size, m.tp, m.cp, m.dp, m.pp, m.vpp,
                   m.pp > 1 ? fmt::format(", {}", e.schedule) : "", m.etp, m.ep, m.edp,
                   c.world_size_note.empty() ? "" : " (" + c.world_size_note + ")"));
  if (c.recipe) {
    const auto& t = c.recipe->training;
    line(fmt::format("batch: {} sequences of {} tokens = {} of {} per rank | {} | recompute {} | zero {}{}",
                     m.global_batch_size, t.seq_len, count_of(e.microbatches, "micro-batch", "micro-batches"), t.micro_batch_size, t.dtype, t.recompute,
                     c.recipe->parallel.zero, c.recipe->parallel.sequence_parallel ? " | sequence parallel" : ""));
  }
  line(fmt::format("device: {}", c.gpu ? fmt::format("{} ({}, {} per GPU)", c.gpu->name, c.gpu->description,
                                                      format_bytes(c.gpu->memory_bytes))
                                       : "CPU (trainer run --cpu)"));
  line("");
  line("memory per rank (peak allocated tensor bytes; worst stage marked *):");
  line(fmt::format("  {:>5} {:>6} {:>11} {:>11} {:>11} {:>11} {:>9} {:>11} {:>11} {:>11}", "stage", "layers", "params",
                   "grads", "optimizer", "act/layer", "in-flight", "activations", "logits", "peak"));
  for (const auto& s : e.stages) {
    const double per_layer = s.moe_layers > 0 ? s.activations_per_layer_moe : s.activations_per_layer_dense;
    line(fmt::format("  {:>4}{} {:>6} {:>11} {:>11} {:>11} {:>11} {:>9.2f} {:>11} {:>11} {:>11}", s.stage,
                     s.stage == e.worst_stage ? "*" : " ", s.layers, format_bytes(s.parameters), format_bytes(s.gradients),
                     format_bytes(s.optimizer_states), format_bytes(per_layer), s.inflight_microbatches,
                     format_bytes(s.activations_other_microbatches + s.activations_microbatch),
                     format_bytes(s.logits_and_loss_peak), format_bytes(s.peak_allocated)));
  }
  const auto& w = e.stages.at(size_t(e.worst_stage));
  line(fmt::format("  peak: {} at {}", format_bytes(e.peak_bytes), w.peak_phase));
  if (e.peak_bytes_worst_routing > e.peak_bytes)
    line(fmt::format("  worst-case MoE routing (all tokens to one rank's experts): {}", format_bytes(e.peak_bytes_worst_routing)));
  if (w.zero2_full_buckets > 0)
    line(fmt::format("  included during micro-batches: ZeRO-2 full-size gradient buckets {}", format_bytes(w.zero2_full_buckets)));
  if (w.zero3_gathered > 0)
    line(fmt::format("  ZeRO-3 gathered parameters at their height {} (in the micro-batch peak)", format_bytes(w.zero3_gathered)));
  if (w.cublas_workspace > 0) line(fmt::format("  included: cuBLAS workspace {}", format_bytes(w.cublas_workspace)));
  if (c.gpu)
    line(fmt::format("  reserved {} (x{:.2f} fragmentation) + {} CUDA context, libraries, NCCL = {} of {}: {}",
                     format_bytes(e.reserved_bytes), c.gpu->fragmentation, format_bytes(c.gpu->framework_overhead_bytes),
                     format_bytes(e.device_total_bytes), format_bytes(e.capacity_bytes),
                     e.fits ? "fits" : "DOES NOT FIT"));
  if (e.documents) {
    const auto& d = *e.documents;
    line("");
    line(fmt::format("documents (log-normal lengths, median {}, p99 {}): attention work {:.3f} of full causal "
                     "attention; slowest rank's attention work over the mean {:.3f} with data.balance \"cost\", {:.3f} "
                     "with \"none\" ({} global batches simulated)",
                     d.median, d.p99, d.attention_fraction, d.imbalance_cost, d.imbalance_none, d.global_batches));
  }
  if (e.has_time) {
    const auto& t = e.time;
    line("");
    line(fmt::format("step time: {} | {} tokens/s ({} per GPU) | {:.1f} TFLOP/s per GPU | MFU {:.1f}%",
                     seconds_text(e.step_time_s), count_text(e.tokens_per_s), count_text(e.tokens_per_s_per_gpu),
                     e.tflops_per_gpu, 100 * e.mfu));
    line(fmt::format("  per micro-batch on the slowest stage: {} x {} micro-batches", seconds_text(t.microbatch_s),
                     e.microbatches));
    line(fmt::format("  compute: GEMM {}, attention {}, memory-bound {} (recompute {} of these)", seconds_text(t.gemm_s),
                     seconds_text(t.attention_s), seconds_text(t.memory_bound_s), seconds_text(t.recompute_s)));
    line(fmt::format("  exposed communication: tp {} ({} hidden), cp {}, ep {}, pp {}, dp {} of {}, parameter gather {}",
                     seconds_text(t.tp_comm_s), seconds_text(t.tp_hidden_s), seconds_text(t.cp_comm_s), seconds_text(t.ep_comm_s),
                     seconds_text(t.pp_comm_s), seconds_text(t.dp_exposed_s), seconds_text(t.dp_comm_s),
                     seconds_text(t.param_gather_s)));
    line(fmt::format("  pipeline bubble {}, optimizer {}", seconds_text(t.bubble_s), seconds_text(t.optimizer_s)));
    line(fmt::format("  host: {} kernels launched, {} ({} exposed: {})", count_text(t.kernels), seconds_text(t.host_s),
                     seconds_text(t.host_exposed_s), t.host_exposed_s > 0 ? "launch-bound" : "GPU-bound"));
  }
  const std::string checkpoints = checkpoints_text(e, c);
  if (!checkpoints.empty()) {
    line("");
    out += checkpoints;
  }
  line("");
  line("assumptions:");
  for (const auto& a : estimate_assumptions(e, c)) line("  - " + a);
  return out;
}

}  // namespace trainer::estimate
