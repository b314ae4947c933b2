#include "metrics/gpu_peaks.h"

#include <algorithm>
#include <cctype>

namespace trainer::metrics {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// The words of a device name, split at spaces, '-' and '_': "NVIDIA A100-SXM4-80GB" ->
// {nvidia, a100, sxm4, 80gb}. Whole words, so "GH200" is not taken for "H200".
std::vector<std::string> words_of(std::string_view name) {
  std::vector<std::string> words;
  std::string word;
  for (char c : lower(name)) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

}  // namespace

const std::vector<GpuPeak>& gpu_peak_table() {
  // NVIDIA datasheets; the tensor-core figures there are quoted with 2:4 sparsity, halved here.
  static const std::vector<GpuPeak> table = {
      {"h100-sxm", "NVIDIA H100 SXM", 989.0, 494.5, 67.0},
      {"h100-pcie", "NVIDIA H100 PCIe", 756.0, 378.0, 51.0},
      {"h100-nvl", "NVIDIA H100 NVL", 835.5, 417.5, 60.0},
      {"h200", "NVIDIA H200 SXM", 989.0, 494.5, 67.0},
      {"h200-nvl", "NVIDIA H200 NVL", 835.5, 417.5, 60.0},
      {"a100-40g", "NVIDIA A100 40GB", 312.0, 156.0, 19.5},
      {"a100-80g", "NVIDIA A100 80GB", 312.0, 156.0, 19.5},
      {"b200", "NVIDIA B200", 2250.0, 1125.0, 75.0},
  };
  return table;
}

double dense_peak_tflops(const GpuPeak& gpu, recipe::Precision dtype) {
  return dtype == recipe::Precision::BF16 ? gpu.bf16_tflops : gpu.fp32_tflops;
}

std::optional<GpuPeak> gpu_peak_for_key(std::string_view key) {
  const std::string wanted = lower(key);
  for (const auto& peak : gpu_peak_table())
    if (peak.key == wanted) return peak;
  return std::nullopt;
}

std::optional<GpuPeak> gpu_peak_for_device_name(std::string_view device_name) {
  const auto words = words_of(device_name);
  const auto has = [&](std::string_view w) { return std::find(words.begin(), words.end(), w) != words.end(); };
  // Names as the driver reports them: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe",
  // "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA A100-SXM4-40GB",
  // "NVIDIA A100 80GB PCIe", "NVIDIA B200".
  const char* key = nullptr;
  if (has("h100")) {
    key = has("pcie") ? "h100-pcie" : has("nvl") ? "h100-nvl" : "h100-sxm";
  } else if (has("h200")) {
    key = has("nvl") ? "h200-nvl" : "h200";
  } else if (has("a100")) {
    // Both memory sizes have the same peaks; the key still says which one it is.
    key = has("80gb") ? "a100-80g" : "a100-40g";
  } else if (has("b200")) {
    key = "b200";
  }
  if (key == nullptr) return std::nullopt;
  return gpu_peak_for_key(key);
}

}  // namespace trainer::metrics
