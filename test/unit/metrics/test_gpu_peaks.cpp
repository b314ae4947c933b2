#include <catch2/catch.hpp>

#include <stdexcept>

#include "metrics/gpu_peaks.h"

using trainer::metrics::dense_peak_tflops;
using trainer::metrics::gpu_peak_for_device_name;
using trainer::metrics::gpu_peak_for_key;

namespace {
std::string key_of(const char* device_name) {
  const auto peak = gpu_peak_for_device_name(device_name);
  return peak ? peak->key : "none";
}
}  // namespace

TEST_CASE("CUDA device names map to their table entries", "[metrics]") {
  CHECK(key_of("NVIDIA H100 80GB HBM3") == "h100-sxm");
  CHECK(key_of("NVIDIA H100") == "h100-sxm");
  CHECK(key_of("NVIDIA H100 PCIe") == "h100-pcie");
  CHECK(key_of("NVIDIA H100 NVL") == "h100-nvl");
  CHECK(key_of("NVIDIA H200") == "h200");
  CHECK(key_of("NVIDIA H200 NVL") == "h200-nvl");
  CHECK(key_of("NVIDIA A100-SXM4-80GB") == "a100-80g");
  CHECK(key_of("NVIDIA A100 80GB PCIe") == "a100-80g");
  CHECK(key_of("NVIDIA A100-SXM4-40GB") == "a100-40g");
  CHECK(key_of("NVIDIA A100-PCIE-40GB") == "a100-40g");
  CHECK(key_of("NVIDIA B200") == "b200");
  CHECK(key_of("nvidia h100 pcie") == "h100-pcie");
}

TEST_CASE("unknown GPUs have no peak and are never guessed", "[metrics]") {
  CHECK(key_of("NVIDIA GH200 480GB") == "none");  // not "H200"
  CHECK(key_of("NVIDIA GB200") == "none");        // not "B200"
  CHECK(key_of("NVIDIA GeForce RTX 4090") == "none");
  CHECK(key_of("Tesla V100-SXM2-16GB") == "none");
  CHECK(key_of("") == "none");
}

TEST_CASE("dense bf16 peaks are the datasheet values", "[metrics]") {
  CHECK(gpu_peak_for_key("h100-sxm")->bf16_tflops == 989.0);
  CHECK(gpu_peak_for_key("h100-pcie")->bf16_tflops == 756.0);
  CHECK(gpu_peak_for_key("h200")->bf16_tflops == 989.0);
  CHECK(gpu_peak_for_key("a100-80g")->bf16_tflops == 312.0);
  CHECK(gpu_peak_for_key("a100-40g")->bf16_tflops == 312.0);
  CHECK(gpu_peak_for_key("B200")->bf16_tflops == 2250.0);
  CHECK_FALSE(gpu_peak_for_key("v100"));
}

TEST_CASE("every recipe hardware.gpu key is in the table", "[metrics]") {
  for (const char* key : {"h100-sxm", "h100-pcie", "h200", "a100-80g", "b200"}) CHECK(gpu_peak_for_key(key));
}

TEST_CASE("the peak follows the training dtype", "[metrics]") {
  const auto h100 = *gpu_peak_for_key("h100-sxm");
  CHECK(dense_peak_tflops(h100, trainer::recipe::Precision::BF16) == 989.0);
  CHECK(dense_peak_tflops(h100, trainer::recipe::Precision::FP32) == 67.0);
}
