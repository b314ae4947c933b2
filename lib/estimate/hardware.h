#pragma once
// GPU profiles for the step-time and memory model: vendor peaks, achievable efficiencies, links
// and framework overheads. The built-in profiles are the JSON files in lib/estimate/profiles/,
// compiled into the binary; a profile file can override any subset of a profile's fields.
// Torch-free. An unknown GPU name is a UserError listing the known ones, never a silent default.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/choices.h"

namespace trainer::estimate {

// One direction of a link, per GPU.
struct LinkProfile {
  double bytes_per_s = 0;  // per GPU, one direction (NVLink 4: 450 GB/s; 400 Gb/s NIC: 50 GB/s)
  double latency_s = 0;    // alpha of the alpha-beta model, per step of a collective
  double efficiency = 1;   // achievable fraction of bytes_per_s (NCCL bus bandwidth / link rate)
};

struct HardwareProfile {
  std::string name;         // key, e.g. "h100-sxm"
  std::string description;
  std::string sources;
  double memory_bytes = 0;  // usable device memory (what the driver reports)
  double bf16_flops = 0;    // dense peaks, FLOP/s
  double fp32_flops = 0;
  double hbm_bytes_per_s = 0;
  // GEMM time = flops / (peak * gemm_efficiency) + gemm_latency_s: efficiency rises with size
  // (half of gemm_efficiency at flops = peak * gemm_efficiency * gemm_latency_s).
  double gemm_efficiency = 0.7;
  double gemm_latency_s = 5e-6;
  // The experts' products (grouped GEMM over uneven row counts, or one matmul per expert): their
  // own efficiency, lower than dense products of the same size (scripts/bench_grouped_mm.py).
  double grouped_gemm_efficiency = 0.6;
  double attention_efficiency = 0.35;  // flash attention, fraction of the dense peak (fwd and bwd)
  double hbm_efficiency = 0.8;         // memory-bound kernels, fraction of HBM bandwidth
  double kernel_overhead_s = 4e-6;     // added to every memory-bound kernel (launch, tail)
  // The host's time per kernel the replay counts (libtorch's dispatcher, autograd and the launch,
  // with the small ops the replay leaves out: about two launches per counted kernel): a step whose
  // kernels take the host longer than the GPU is bound by the host.
  double host_s_per_kernel = 0;
  LinkProfile nvlink;                  // inside a node (NVSwitch domain of gpus_per_node)
  LinkProfile network;                 // across nodes
  double framework_overhead_bytes = 0; // CUDA context, libraries, NCCL buffers: outside the allocator
  double cublas_workspace_bytes = 0;   // allocated through the caching allocator
  double fragmentation = 1.1;          // reserved / allocated of the caching allocator
  // Checkpoints (checkpoint_cost.h): the achievable pinned device-to-host copy rate per GPU (its
  // PCIe link), and the checkpoint storage's bandwidth per GPU when every GPU writes at once.
  double host_d2h_bytes_per_s = 0;
  double storage_bytes_per_s = 0;

  double peak_flops(recipe::Precision dtype) const;
};

// Every built-in profile, sorted by name.
const std::vector<HardwareProfile>& builtin_profiles();
std::vector<std::string> builtin_profile_names();

// The built-in profile `name`. Throws UserError naming the known profiles (and the nearest one).
const HardwareProfile& builtin_profile(const std::string& name);

// `base` with the fields given in `overrides` (the profile JSON format, any subset; unknown keys
// and wrong types are UserErrors naming `source` and the JSON path).
HardwareProfile apply_profile_overrides(const HardwareProfile& base, const nlohmann::json& overrides,
                                        const std::string& source);

// Reads a profile file. Its optional "base" names the built-in profile it starts from; otherwise
// `default_base` (hardware.gpu or --gpu). Throws UserError for unreadable or invalid files.
HardwareProfile load_profile_file(const std::string& path, const std::string& default_base);

// The profile in the JSON format of lib/estimate/profiles/ (round-trips through
// apply_profile_overrides).
nlohmann::json profile_to_json(const HardwareProfile& profile);

}  // namespace trainer::estimate
