#include "train/step_log.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

#include "core/plural.h"
#include "estimate/hardware.h"
#include "metrics/cpu_memory.h"
#include "metrics/cuda_memory.h"
#include "metrics/gpu_peaks.h"
#include "metrics/human_format.h"
#include "metrics/step_metrics.h"
#include "model/attention_backend.h"
#include "metrics/throughput.h"
#include "train/straggler_watch.h"

namespace trainer::train {

namespace {

using Clock = std::chrono::steady_clock;

// The TensorBoard scalars of a logged step: the metrics line's numbers under grouped tags.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const metrics::StepMetrics& m) {
  std::vector<std::pair<std::string, double>> s = {
      {"train/loss", m.loss},
      {"train/lr", m.lr},
      {"train/grad_norm", m.grad_norm},
      {"perf/tokens_per_s", m.tokens_per_s},
      {"perf/tflops_per_device", m.tflops_per_device},
      {"memory/peak_bytes", double(m.mem_peak_bytes)},
      {"time/step_s", m.time_s},
  };
  if (m.mfu) s.emplace_back("perf/mfu", *m.mfu);
  const auto& x = m.extra;
  if (x.contains("time_breakdown"))
    for (const auto& [phase, seconds] : x["time_breakdown"].items()) s.emplace_back("time/" + phase, seconds.get<double>());
  if (x.contains("aux_loss")) s.emplace_back("moe/aux_loss", x["aux_loss"].get<double>());
  if (x.contains("mtp_loss")) s.emplace_back("train/mtp_loss", x["mtp_loss"].get<double>());
  if (x.contains("z_loss")) s.emplace_back("moe/z_loss", x["z_loss"].get<double>());
  for (const char* key : {"own_time_max_ratio", "step_time_max_ratio"})
    if (x.contains(key)) s.emplace_back(std::string("straggler/") + key, x[key].get<double>());
  if (x.contains("moe_layers"))
    for (const auto& layer : x["moe_layers"]) {
      const std::string prefix = fmt::format("moe/layer_{}/", layer["layer"].get<int64_t>());
      s.emplace_back(prefix + "max_over_mean", layer["max_over_mean"].get<double>());
      s.emplace_back(prefix + "cv", layer["cv"].get<double>());
    }
  return s;
}

void reset_peak_memory(bool on_gpu) {
  if (on_gpu)
    metrics::reset_cuda_peak_memory();
  else
    metrics::CpuMemoryTracker::reset_peak();
}

}  // namespace

StepLog::StepLog(const recipe::LoadedRecipe& loaded, c10::Device device, FILE* log)
    : loaded_(loaded), recipe_(loaded.recipe), mesh_(loaded.mesh.value()), device_(device), log_(log) {
  const recipe::Recipe& r = recipe_;
  counts_ = estimate::count_model(r.model, r.training.seq_len);
  // What the estimator predicts for this very run (torch-free, the same code as `trainer estimate`).
  std::optional<estimate::HardwareProfile> profile;
  if (device.is_cuda()) {
    device_name_ = at::cuda::getDeviceProperties(device.index())->name;
    if (auto gpu = metrics::gpu_peak_for_device_name(device_name_)) {
      peak_tflops_ = metrics::dense_peak_tflops(*gpu, r.training.dtype);
      try {
        profile = estimate::builtin_profile(gpu->key);
      } catch (const std::exception&) {
      }
    }
  }
  estimate::EstimateOptions estimate_options;
  estimate_options.cpu_threads = at::get_num_threads();
  predicted_ = estimate::estimate_job(r, mesh_, profile ? &*profile : nullptr, estimate_options);
  if (log_ && r.logging.metrics_file) metrics_file_ = std::make_unique<metrics::MetricsFile>(*r.logging.metrics_file);
  if (log_ && r.logging.tensorboard_dir)
    tensorboard_ = std::make_unique<metrics::TensorBoardWriter>(*r.logging.tensorboard_dir);
  run_start_ = Clock::now();
  reset_peak_memory(device.is_cuda());
}

void StepLog::say(const std::string& line) const {
  if (!log_) return;
  std::fputs((line + "\n").c_str(), log_);
  std::fflush(log_);
}

void StepLog::print_opening(const data::Dataset& dataset, const std::string& optimizer_description) {
  const recipe::Recipe& r = recipe_;
  // Document masking: where documents end, and whether the ranks' work is balanced.
  std::string documents;
  if (r.data.document_masking)
    documents = fmt::format(
        ", documents masked ({}{}{}, balance {})",
        r.data.document_separator_token ? fmt::format("ending after token {}", *r.data.document_separator_token)
                                        : std::string("from the document index"),
        r.data.reset_positions ? ", positions restart" : "",
        r.data.predict_across_documents ? ", predicting across them" : "", r.data.balanced() ? "cost" : "none");
  say(fmt::format("model: {} parameters ({} active), {} FLOPs/token | data: {}{} | device: {} {} x {} | global batch "
                  "{} x {} tokens ({} of {} per rank) | {}",
                  metrics::format_count(double(counts_.total_params)), metrics::format_count(double(counts_.active_params)),
                  metrics::format_count(counts_.flops_per_token), dataset.describe(), documents, mesh_.world_size, device_name_,
                  r.training.dtype, mesh_.global_batch_size, r.training.seq_len,
                  count_of(mesh_.grad_accum_steps, "micro-batch", "micro-batches"), r.training.micro_batch_size,
                  optimizer_description));
  // The attention kernel ATen picks for this rank's heads (issue: which backend runs on a GPU).
  const int64_t tp = mesh_.tp, cp = mesh_.cp;
  const bool ulysses = cp > 1 && r.parallel.cp_method == recipe::CpMethod::Ulysses;
  const int64_t split = ulysses ? tp * cp : tp;
  const int64_t heads = r.model.num_attention_heads / split, kv = std::max<int64_t>(1, r.model.num_key_value_heads / split);
  const int64_t head_dim = r.model.attention_head_dim();
  if (cp > 1 && !ulysses) {
    say(fmt::format("attention: ring over cp {} ({} query / {} key-value heads of {} per rank)", cp, heads, kv,
                    head_dim));
  } else {
    const auto dtype = r.training.dtype == recipe::Precision::BF16 ? at::kBFloat16 : at::kFloat;
    say(fmt::format("attention: {}scaled_dot_product_attention on ATen's {} kernel ({} query / {} key-value heads of {} "
                    "per rank, {})",
                    ulysses ? fmt::format("Ulysses over cp {}, then ", cp) : "",
                    model::sdpa_backend(device_, dtype, heads, kv, head_dim), heads, kv, head_dim,
                    r.training.dtype));
  }
  // Which fused kernels run (training.fused_kernels): on a CUDA device only.
  if (device_.is_cuda()) {
    const auto& k = r.training.fused_kernels;
    say(k.empty() ? std::string("fused kernels: none (training.fused_kernels is [])")
                  : fmt::format("fused kernels: {}", fmt::join(k, ", ")));
  }
  floor_ = dataset.entropy_floor();
  if (floor_) say(fmt::format("loss floor of this data: {:.4f} nats/token", *floor_));
}

void StepLog::after_step(StepEnd& end) {
  if (!end.reading) return;
  const StepReading& r = *end.reading;
  // A diverged step's line is printed before the divergence check stops the run.
  if (r.logged || r.diverged()) print_step(end, r);
}

std::string StepLog::moe_statistics(const StepFigures& f, nlohmann::json* extra) const {
  const at::Tensor load = f.moe_load.to(at::kCPU);
  const std::vector<int64_t> layers = recipe_.model.routed_layers();
  nlohmann::json per_layer = nlohmann::json::array();
  double worst = 0, worst_cv = 0;
  int64_t worst_layer = -1;
  for (int64_t row = 0; row < load.size(0); ++row) {
    const at::Tensor counts = load[row];
    const double mean = counts.mean().item<double>();
    // Max over mean (1 when balanced) and the coefficient of variation of the experts' loads.
    const double max_over_mean = mean > 0 ? counts.max().item<double>() / mean : 0.0;
    const double cv = mean > 0 ? counts.std(/*unbiased=*/false).item<double>() / mean : 0.0;
    std::vector<int64_t> tokens;
    for (int64_t e = 0; e < counts.size(0); ++e) tokens.push_back(int64_t(counts[e].item<double>()));
    per_layer.push_back({{"layer", layers[size_t(row)]},
                         {"tokens_per_expert", tokens},
                         {"max_over_mean", max_over_mean},
                         {"cv", cv}});
    if (max_over_mean > worst) worst = max_over_mean, worst_cv = cv, worst_layer = layers[size_t(row)];
  }
  const double margin = f.min_margin.item<double>();
  const double z = f.z_sum.item<double>() / double(mesh_.grad_accum_steps * mesh_.dp);
  (*extra)["moe_layers"] = per_layer;
  (*extra)["moe_min_topk_margin"] = std::isfinite(margin) ? nlohmann::json(margin) : nlohmann::json();
  if (recipe_.model.moe->router_z_loss_coef > 0) (*extra)["z_loss"] = z;
  if (worst_layer < 0) return "";
  return fmt::format(" | expert load max/mean {:.2f} (layer {}, cv {:.2f})", worst, worst_layer, worst_cv);
}

metrics::StepMetrics StepLog::step_metrics(const StepEnd& end, const StepReading& reading) const {
  const recipe::Recipe& r = recipe_;
  const int64_t step = end.step;
  const double seconds = reading.seconds;
  const StepFigures& f = end.figures;
  const engine::OverlapStats* overlap = end.overlap;
  const bool on_gpu = device_.is_cuda();
  metrics::StepMetrics m;
  m.step = step;
  m.total_steps = r.training.steps;
  m.loss = reading.loss;
  m.lr = end.lr;
  m.grad_norm = reading.grad_norm;
  const int64_t global_tokens = mesh_.global_batch_size * r.training.seq_len;
  // With document masking the model FLOPs count only the attention inside documents: the
  // full-square attention term (12 L h d T per token, model_counts.h) scaled by the global batch's
  // sum of squared document lengths over samples x T^2 (docs/estimator.md).
  double flops_per_token = counts_.flops_per_token;
  std::optional<double> attention_fraction;
  if (f.document_squares.defined()) {
    const double square = double(r.training.seq_len) * double(r.training.seq_len);
    attention_fraction = f.document_squares.item<double>() / (double(mesh_.global_batch_size) * square);
    flops_per_token = counts_.dense_flops_per_token + counts_.attention_flops_per_token * *attention_fraction;
  }
  const auto throughput =
      metrics::measure_throughput(global_tokens, seconds, flops_per_token, mesh_.world_size, peak_tflops_);
  m.tokens_per_s = throughput.tokens_per_s;
  m.tflops_per_device = throughput.tflops_per_device;
  m.mfu = throughput.mfu;
  m.mem_peak_bytes = on_gpu ? metrics::cuda_memory_stats().peak_allocated_bytes : metrics::CpuMemoryTracker::peak_bytes();
  m.time_s = seconds;
  m.eta_s = reading.mean_step_s * double(r.training.steps - step);
  m.extra = {{"elapsed_s", std::chrono::duration<double>(Clock::now() - run_start_).count()},
             {"consumed_samples", step * mesh_.global_batch_size}};
  if (r.model.moe) m.extra["aux_loss"] = reading.aux_loss;
  if (r.model.num_nextn_predict_layers > 0) m.extra["mtp_loss"] = reading.mtp_loss;
  if (floor_) m.extra["loss_floor"] = *floor_;
  if (attention_fraction) m.extra["attention_work_fraction"] = *attention_fraction;
  m.extra["mem_predicted_bytes"] = int64_t(predicted_.peak_bytes);
  m.extra["step_time_predicted_s"] = predicted_.has_time ? nlohmann::json(predicted_.step_time_s) : nlohmann::json();
  if (f.chunk_seconds.defined()) {
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t c = 0; c < f.chunk_seconds.size(0); ++c)
      rows.push_back({f.chunk_seconds[c][0].item<double>(), f.chunk_seconds[c][1].item<double>(),
                      f.chunk_seconds[c][2].item<double>()});
    m.extra["chunk_compute_s"] = rows;
  }
  if (f.stage_peak_bytes.defined() && f.stage_peak_bytes.numel() > 1) {
    std::vector<int64_t> peaks;
    for (int64_t s = 0; s < f.stage_peak_bytes.numel(); ++s) peaks.push_back(int64_t(f.stage_peak_bytes[s].item<double>()));
    m.extra["stage_mem_peak_bytes"] = peaks;
  }
  if (overlap)
    m.extra["dp_overlap"] = {{"buckets", overlap->buckets},
                             {"launched_in_backward", overlap->launched_in_backward},
                             {"first_launch_s", overlap->first_launch_s},
                             {"backward_end_s", overlap->backward_end_s}};
  {
    // Where the step's time went (train/step_times.h); `other_s`: the rest of the wall time
    // (pipeline sends and receives outside computation, the gradient norm, logging, evaluation).
    const StepTimes& t = reading.times;
    m.extra["time_breakdown"] = {{"data_s", t.data_s},           {"forward_s", t.forward_s},
                                 {"backward_s", t.backward_s},   {"comm_wait_s", t.comm_wait_s},
                                 {"optimizer_s", t.optimizer_s}, {"checkpoint_s", t.checkpoint_s},
                                 {"other_s", std::max(0.0, seconds - t.total())}};
    if (!t.comm_wait_by_group_s.empty()) m.extra["comm_wait_by_group_s"] = t.comm_wait_by_group_s;
  }
  if (overlap && overlap->param_gather_wait_s >= 0) m.extra["dp_overlap"]["param_gather_wait_s"] = overlap->param_gather_wait_s;
  if (const StragglerReport* s = end.straggler) {
    // Both ratios at every logged step, so that a run shows what step times alone would have said.
    m.extra["own_time_max_ratio"] = s->verdict.own_time_max_ratio;
    const int64_t slowest = s->verdict.own_time_max_rank;
    m.extra["own_time_max_rank"] = slowest >= 0 ? nlohmann::json(slowest) : nlohmann::json();  // null: no rank has peers
    m.extra["step_time_max_ratio"] = s->verdict.step_time_max_ratio;
    if (!s->verdict.named.empty()) m.extra["straggler_rank"] = s->verdict.named.front().rank;
  }
  return m;
}

void StepLog::print_step(const StepEnd& end, const StepReading& reading) {
  const StepFigures& f = end.figures;
  const int64_t step = end.step;
  const double seconds = reading.seconds;
  const bool on_gpu = device_.is_cuda();
  metrics::StepMetrics m = step_metrics(end, reading);
  std::string moe_summary;
  if (f.moe_load.defined()) moe_summary = moe_statistics(f, &m.extra);
  const std::string mtp_summary =
      m.extra.contains("mtp_loss") ? fmt::format(" | mtp loss {:.4f}", m.extra["mtp_loss"].get<double>()) : "";
  say(metrics::format_console_line(m) + mtp_summary + moe_summary);
  if (end.straggler)
    for (const std::string& line : end.straggler->lines) say(line);
  if (!compared_) {
    compared_ = true;
    say(fmt::format("predicted vs measured (rank 0): peak tensor memory {} vs {} ({:+.1f}%); step time {}",
                    metrics::format_bytes(int64_t(predicted_.peak_bytes)), metrics::format_bytes(m.mem_peak_bytes),
                    100.0 * (predicted_.peak_bytes - double(m.mem_peak_bytes)) / double(std::max<int64_t>(1, m.mem_peak_bytes)),
                    predicted_.has_time ? fmt::format("{:.3f} s vs {:.3f} s", predicted_.step_time_s, seconds)
                                        : fmt::format("not predicted on the CPU (measured {:.3f} s)", seconds)));
  }
  if (metrics_file_) metrics_file_->write(m);
  if (tensorboard_) tensorboard_->add_scalars(step, tensorboard_scalars(m));
  reset_peak_memory(on_gpu);  // the next logged peak covers the steps since this line
}

void StepLog::evaluation(int64_t step, const EvaluationResult& result) {
  say(fmt::format("evaluation after step {}: loss {:.4f} | perplexity {:.3f} | {} held-out tokens", step, result.loss,
                  result.perplexity, metrics::format_count(double(result.tokens))));
  if (tensorboard_) tensorboard_->add_scalars(step, {{"eval/loss", result.loss}, {"eval/perplexity", result.perplexity}});
  if (metrics_file_)
    metrics_file_->write(nlohmann::json{{"step", step},
                                        {"eval_loss", result.loss},
                                        {"eval_perplexity", result.perplexity},
                                        {"eval_tokens", result.tokens}});
}

}  // namespace trainer::train
