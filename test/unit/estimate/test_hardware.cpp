#include <catch2/catch.hpp>

#include <fstream>

#include "core/error.h"
#include "estimate/hardware.h"
#include "recipe/schema.h"

using namespace trainer::estimate;

TEST_CASE("built-in profiles: the five required GPUs and more - with datasheet peaks", "[estimate]") {
  const auto names = builtin_profile_names();
  for (const char* name : {"h100-sxm", "h100-pcie", "h200", "a100-80g", "b200", "a100-40g"})
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  // Dense bf16 peaks (the datasheets' tensor figures assume 2:4 sparsity; halved), as in
  // lib/metrics/gpu_peaks.cpp and REFERENCES.md.
  CHECK(builtin_profile("h100-sxm").bf16_flops == 989e12);
  CHECK(builtin_profile("h100-pcie").bf16_flops == 756e12);
  CHECK(builtin_profile("h200").bf16_flops == 989e12);
  CHECK(builtin_profile("a100-80g").bf16_flops == 312e12);
  CHECK(builtin_profile("b200").bf16_flops == 2250e12);
  CHECK(builtin_profile("h100-sxm").hbm_bytes_per_s == 3.35e12);
  CHECK(builtin_profile("h200").hbm_bytes_per_s == 4.8e12);
  CHECK(builtin_profile("a100-80g").hbm_bytes_per_s == Approx(2.039e12));
  CHECK(builtin_profile("h100-sxm").nvlink.bytes_per_s == 450e9);   // 900 GB/s bidirectional
  CHECK(builtin_profile("h100-sxm").network.bytes_per_s == 50e9);   // 400 Gb/s per GPU
  CHECK(builtin_profile("h100-sxm").memory_bytes == Approx(79.6 * 1024 * 1024 * 1024));
  CHECK(builtin_profile("h100-sxm").host_d2h_bytes_per_s == Approx(51e9));   // PCIe 5.0 x16 at 80%
  CHECK(builtin_profile("a100-80g").host_d2h_bytes_per_s == Approx(25.6e9));  // PCIe 4.0 x16 at 80%
  CHECK(builtin_profile("h100-sxm").storage_bytes_per_s == Approx(0.12e9));   // Llama 3: 2 TB/s / 16,384 GPUs
  for (const auto& p : builtin_profiles()) {
    INFO(p.name);
    CHECK(!p.description.empty());
    CHECK(!p.sources.empty());
    CHECK(p.gemm_efficiency > 0);
    CHECK(p.gemm_efficiency < 1);
    CHECK(p.attention_efficiency < p.gemm_efficiency);
    CHECK(p.fragmentation >= 1);
    CHECK(p.peak_flops(trainer::recipe::Precision::FP32) < p.peak_flops(trainer::recipe::Precision::BF16));
  }
}

TEST_CASE("hardware.gpu accepts exactly the built-in profiles", "[estimate]") {
  const auto* spec = trainer::recipe::find_key("hardware.gpu");
  REQUIRE(spec != nullptr);
  auto choices = spec->choices;
  auto names = builtin_profile_names();
  std::sort(choices.begin(), choices.end());
  CHECK(choices == names);
}

TEST_CASE("an unknown GPU is an error naming the known ones - never a default", "[estimate]") {
  CHECK_THROWS_AS(builtin_profile("v100"), trainer::UserError);
  CHECK_THROWS_WITH(builtin_profile("h100"), Catch::Contains("unknown GPU \"h100\"") && Catch::Contains("h100-sxm") &&
                                                 Catch::Contains("b200"));
  CHECK_THROWS_WITH(builtin_profile("h100-smx"), Catch::Contains("did you mean \"h100-sxm\""));
}

TEST_CASE("a profile file overrides any subset of fields", "[estimate]") {
  const auto& base = builtin_profile("h100-sxm");
  const auto p = apply_profile_overrides(
      base, nlohmann::json::parse(R"({"memory_gib": 94.5, "peak_tflops": {"bf16": 900}, "links": {"network": {"gb_s": 25}}})"),
      "test");
  CHECK(p.memory_bytes == Approx(94.5 * 1024 * 1024 * 1024));
  CHECK(p.bf16_flops == 900e12);
  CHECK(p.network.bytes_per_s == 25e9);
  CHECK(p.fp32_flops == base.fp32_flops);  // untouched
  CHECK(p.nvlink.bytes_per_s == base.nvlink.bytes_per_s);
  // Unknown keys and wrong types name the path.
  CHECK_THROWS_WITH(apply_profile_overrides(base, nlohmann::json::parse(R"({"memory_gb": 80})"), "f.json"),
                    Catch::Contains("f.json") && Catch::Contains("unknown key memory_gb") &&
                        Catch::Contains("memory_gib"));
  CHECK_THROWS_WITH(apply_profile_overrides(base, nlohmann::json::parse(R"({"hbm_tb_s": "fast"})"), "f.json"),
                    Catch::Contains("hbm_tb_s") && Catch::Contains("expected a number > 0"));
  CHECK_THROWS_WITH(apply_profile_overrides(base, nlohmann::json::parse(R"({"efficiency": {"gemm": 0}})"), "f.json"),
                    Catch::Contains("efficiency.gemm"));
}

TEST_CASE("profile files: base - name - round trip", "[estimate]") {
  const std::string path = "/tmp/trainer_unit_estimate_profile.json";
  {
    std::ofstream out(path);
    out << R"({"base": "a100-80g", "hbm_tb_s": 1.9})";
  }
  const auto p = load_profile_file(path, "h100-sxm");
  CHECK(p.bf16_flops == 312e12);  // from the file's base, not the default
  CHECK(p.hbm_bytes_per_s == 1.9e12);
  CHECK(p.name.find("a100-80g") == 0);
  {
    std::ofstream out(path);
    out << R"({"base": "nope"})";
  }
  CHECK_THROWS_AS(load_profile_file(path, "h100-sxm"), trainer::UserError);
  CHECK_THROWS_AS(load_profile_file("/nonexistent/profile.json", "h100-sxm"), trainer::UserError);
  std::remove(path.c_str());
  for (const auto& profile : builtin_profiles()) {
    const auto again = apply_profile_overrides(HardwareProfile{}, profile_to_json(profile), "round trip");
    CHECK(again.name == profile.name);
    CHECK(again.memory_bytes == Approx(profile.memory_bytes));
    CHECK(again.gemm_latency_s == Approx(profile.gemm_latency_s));
    CHECK(again.network.latency_s == Approx(profile.network.latency_s));
  }
}
