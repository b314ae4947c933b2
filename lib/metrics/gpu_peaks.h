#pragma once
// Peak arithmetic throughput of the GPUs we know, the denominator of MFU. An explicit table from
// the vendors' datasheets (dense, i.e. without 2:4 sparsity); a GPU that is not in it has no
// peak, and then MFU is reported as unknown rather than guessed.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/choices.h"

namespace trainer::metrics {

struct GpuPeak {
  std::string key;          // short name as in recipe hardware.gpu: "h100-sxm", "a100-80g", ...
  std::string description;  // "NVIDIA H100 SXM"
  double bf16_tflops;       // dense bf16 tensor-core peak, TFLOP/s
  double tf32_tflops;       // dense tf32 tensor-core peak, TFLOP/s
  double fp32_tflops;       // plain fp32 (CUDA cores, no tensor cores), TFLOP/s
};

// Every GPU in the table, in a fixed order.
const std::vector<GpuPeak>& gpu_peak_table();

// The entry for a CUDA device name as the driver reports it ("NVIDIA H100 80GB HBM3" -> h100-sxm,
// "NVIDIA H100 PCIe" -> h100-pcie, "NVIDIA A100-SXM4-80GB" -> a100-80g). Matching ignores case.
// std::nullopt for a device that is not in the table (or not recognised unambiguously).
std::optional<GpuPeak> gpu_peak_for_device_name(std::string_view device_name);

// The dense peak that bounds training in `dtype`, in TFLOP/s: bf16 -> bf16_tflops; fp32 ->
// fp32_tflops (libtorch leaves TF32 off for matmuls by default, so fp32 runs on the CUDA cores).
double dense_peak_tflops(const GpuPeak& gpu, recipe::Precision dtype);

// The entry whose key is `key` (case-insensitive), std::nullopt when there is none.
std::optional<GpuPeak> gpu_peak_for_key(std::string_view key);

}  // namespace trainer::metrics
