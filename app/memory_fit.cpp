#include "memory_fit.h"

#include <fmt/format.h>

#include <new>
#include <optional>

#include <c10/util/Exception.h>

#include "core/error.h"
#include "estimate/estimate.h"
#include "estimate/hardware.h"
#include "metrics/gpu_peaks.h"

namespace trainer::app {

namespace {

// How to make a run fit, for the refusal and for a real out-of-memory error.
std::string memory_fixes(const std::string& recipe_path) {
  return fmt::format(
      "to fit, use fewer or smaller layers (model.num_hidden_layers, training.seq_len, "
      "training.micro_batch_size), --set training.recompute=full, more ranks (--nproc-per-node, --nnodes) with "
      "parallel.zero=1..3, tp or pp, or a GPU; `trainer run {} --dry-run` with the same options shows where the "
      "memory goes",
      recipe_path);
}

}  // namespace

MemoryFit measure_memory_fit(const recipe::LoadedRecipe& loaded, const runtime::DeviceAssignment& device,
                             int64_t local_ranks, int cpu_threads) {
  MemoryFit fit;
  const bool on_gpu = device.on_gpu;
  fit.available = on_gpu ? runtime::available_gpu_memory(device.device_index, device.ranks_per_gpu)
                         : runtime::available_cpu_memory(local_ranks);
  std::optional<estimate::HardwareProfile> profile;
  if (on_gpu)
    if (const auto gpu = metrics::gpu_peak_for_device_name(fit.available.gpu_name))
      try {
        profile = estimate::builtin_profile(gpu->key);
      } catch (const std::exception&) {
      }
  estimate::EstimateOptions options;
  options.cpu_threads = cpu_threads;
  options.compute_time = false;
  options.describe_peak = false;
  fit.needed_bytes =
      estimate::estimate_job(loaded.recipe, *loaded.mesh, profile ? &*profile : nullptr, options).peak_bytes;
  return fit;
}

void check_memory_fit(const recipe::LoadedRecipe& loaded, const MemoryFit& fit) {
  if (fit.available.bytes <= 0 || fit.needed_bytes <= fit.available.bytes) return;
  throw UserError(fmt::format(
      "{}: this run needs about {} of memory per rank (the estimate's peak), but {} has {} for it ({}); {}. To "
      "start anyway, pass --no-memory-check",
      loaded.source, runtime::gib(fit.needed_bytes), fit.available.device, runtime::gib(fit.available.bytes),
      fit.available.source, memory_fixes(loaded.source)));
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const std::string text = e.what();
  return dynamic_cast<const c10::Error*>(&e) &&
         (text.find("can't allocate memory") != std::string::npos || text.find("out of memory") != std::string::npos);
}

std::string out_of_memory_message(const std::exception& e, const recipe::LoadedRecipe& loaded, const MemoryFit& fit) {
  std::string reason = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) reason = c10_error->what_without_backtrace();
  if (const auto newline = reason.find('\n'); newline != std::string::npos) reason.resize(newline);
  if (reason.rfind("[enforce fail at ", 0) == 0)  // "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPU..."
    if (const auto sentence = reason.find(". ", reason.find(']')); sentence != std::string::npos)
      reason = reason.substr(sentence + 2);
  return fmt::format("out of memory on {} ({}); the estimate for this run is {} per rank{}; {}",
                     fit.available.device.empty() ? "this device" : fit.available.device, reason,
                     runtime::gib(fit.needed_bytes),
                     fit.available.bytes > 0
                         ? fmt::format(", and {} was available at the start ({})", runtime::gib(fit.available.bytes),
                                       fit.available.source)
                         : "",
                     memory_fixes(loaded.source));
}

}  // namespace trainer::app
