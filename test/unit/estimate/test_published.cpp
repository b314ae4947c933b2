// The estimator against published measurements (docs/estimator.md, "Published measurements").
// Prints the comparison table when run as: unit_estimate "[published]" -s
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>

#include "estimate/estimate.h"
#include "estimate_fixture.h"

using namespace trainer::estimate;
using trainer::test::load;

namespace {

struct Published {
  const char* name;
  const char* source;
  const char* recipe;
  std::vector<std::string> sets;
  int64_t gpus;
  const char* gpu;
  const char* profile_overrides;  // JSON, "" for none
  bool fused;
  bool mfu;          // the published figure is MFU (else tokens/s per GPU)
  double measured;
};

const std::vector<std::string> kFsdp = {"parallel.tp=1", "parallel.sequence_parallel=false", "parallel.zero=3"};
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
// torchtitan's H100s: 96 GB HBM2e at 2.4 TB/s, 500 W, "peak between SXM and NVL" (we take the middle).
const char* kTitanH100 = R"({"memory_gib": 94.5, "hbm_tb_s": 2.4, "peak_tflops": {"bf16": 912}})";
// Megatron-LM's GPT models: vocabulary 131072, sequence 4096, GELU MLP 4h (a SwiGLU of 8h/3 has the
// same parameters and FLOPs), tied embeddings, no recomputation, bf16, sequence parallelism.
std::vector<std::string> gpt(int64_t h, int64_t layers, int64_t heads, int64_t ffn) {
  return {"model.vocab_size=131072", "training.seq_len=4096", "model.max_position_embeddings=4096",
          "model.hidden_size=" + std::to_string(h), "model.num_hidden_layers=" + std::to_string(layers),
          "model.num_attention_heads=" + std::to_string(heads), "model.num_key_value_heads=" + std::to_string(heads),
          "model.intermediate_size=" + std::to_string(ffn), "model.tie_word_embeddings=true",
          "training.recompute=none", "training.micro_batch_size=1", "parallel.zero=1"};
}
const std::vector<std::string> kLlama2_13b = {"model.vocab_size=32000", "model.hidden_size=5120",
                                              "model.num_hidden_layers=40", "model.num_attention_heads=40",
                                              "model.num_key_value_heads=40", "model.intermediate_size=13824",
                                              "training.seq_len=4096", "model.max_position_embeddings=4096"};
const std::vector<std::string> kLlama2_70b = {"model.vocab_size=32000", "model.hidden_size=8192",
                                              "model.num_hidden_layers=80", "model.num_attention_heads=64",
                                              "model.num_key_value_heads=8", "model.intermediate_size=28672",
                                              "training.seq_len=4096", "model.max_position_embeddings=4096"};

std::vector<Published> cases() {
  return {
      {"Llama 3.1 8B, FSDP, 8 H100, bs 2, selective AC", "torchtitan benchmarks 2024-12, table 1", "llama3-8b.json",
       with(kFsdp, {"training.micro_batch_size=2", "training.global_batch_size=16", "training.recompute=selective"}), 8,
       "h100-sxm", kTitanH100, false, false, 5762},
      {"same + torch.compile", "torchtitan benchmarks 2024-12, table 1", "llama3-8b.json",
       with(kFsdp, {"training.micro_batch_size=2", "training.global_batch_size=16", "training.recompute=selective"}), 8,
       "h100-sxm", kTitanH100, true, false, 6667},
      {"Llama 3.1 8B, FSDP, 128 H100, bs 2, selective AC", "torchtitan benchmarks 2024-12, table 3", "llama3-8b.json",
       with(kFsdp, {"training.micro_batch_size=2", "training.global_batch_size=256", "training.recompute=selective"}),
       128, "h100-sxm", kTitanH100, false, false, 5605},
      {"same + torch.compile", "torchtitan benchmarks 2024-12, table 3", "llama3-8b.json",
       with(kFsdp, {"training.micro_batch_size=2", "training.global_batch_size=256", "training.recompute=selective"}),
       128, "h100-sxm", kTitanH100, true, false, 6514},
      {"Llama 3 8B, FSDP, 64 A100, bs 1, selective AC", "torchtitan docs/performance.md", "llama3-8b.json",
       with(kFsdp, {"training.micro_batch_size=1", "training.global_batch_size=64", "training.recompute=selective"}), 64,
       "a100-80g", "", false, false, 2973},
      {"Llama 3 70B, FSDP, 64 A100, bs 1, full AC", "torchtitan docs/performance.md", "llama3-70b.json",
       with(kFsdp, {"training.micro_batch_size=1", "training.global_batch_size=64", "training.recompute=full",
                    "parallel.pp=1", "parallel.vpp=1", "parallel.pipeline_schedule=1f1b", "parallel.cp=1"}),
       64, "a100-80g", "", false, false, 331},
      {"Llama 2 13B, FSDP, 64 A100, bs 2, no AC", "torchtitan docs/performance.md", "llama3-8b.json",
       with(with(kFsdp, kLlama2_13b), {"training.micro_batch_size=2", "training.global_batch_size=128",
                                       "training.recompute=none"}),
       64, "a100-80g", "", false, false, 2162},
      {"Llama 2 70B, FSDP, 64 A100, bs 2, full AC", "torchtitan docs/performance.md", "llama3-8b.json",
       with(with(kFsdp, kLlama2_70b), {"training.micro_batch_size=2", "training.global_batch_size=128",
                                       "training.recompute=full"}),
       64, "a100-80g", "", false, false, 353},
      {"GPT 7.1B, TP 2, 64 H100", "Megatron-LM README (H100, seq 4096)", "llama3-8b.json",
       with(gpt(4096, 32, 32, 10922), {"parallel.tp=2", "parallel.sequence_parallel=true",
                                       "training.global_batch_size=1024"}),
       64, "h100-sxm", "", true, true, 0.47},
      {"GPT 70B, TP 8, PP 2, 256 H100", "Megatron-LM README (H100, seq 4096)", "llama3-8b.json",
       with(gpt(8192, 80, 64, 21848), {"parallel.tp=8", "parallel.pp=2", "parallel.sequence_parallel=true",
                                       "training.global_batch_size=1024"}),
       256, "h100-sxm", "", true, true, 0.42},
      {"GPT 462B, TP 8, PP 16, 6144 H100", "Megatron-LM README (H100, seq 4096)", "llama3-8b.json",
       with(gpt(18432, 112, 144, 49152), {"parallel.tp=8", "parallel.pp=16", "parallel.sequence_parallel=true",
                                          "training.global_batch_size=3072"}),
       6144, "h100-sxm", "", true, true, 0.47},
  };
}

}  // namespace

TEST_CASE("published measurements: each prediction within 30%", "[estimate][published]") {
  std::printf("\n| configuration | source | GPUs | measured | predicted | error |\n|---|---|---:|---:|---:|---:|\n");
  double worst = 0;
  for (const auto& c : cases()) {
    // Eager PyTorch (torchtitan without compile) runs the unfused ATen ops.
    const auto loaded = load(c.recipe, c.fused ? c.sets : with(c.sets, {"training.fused_kernels=[]"}), c.gpus);
    HardwareProfile gpu = builtin_profile(c.gpu);
    if (*c.profile_overrides) gpu = apply_profile_overrides(gpu, nlohmann::json::parse(c.profile_overrides), "test");
    EstimateOptions options;
    options.fused_kernels = c.fused;
    const auto e = estimate_job(loaded.recipe, *loaded.mesh, &gpu, options);
    const double predicted = c.mfu ? e.mfu : e.tokens_per_s_per_gpu;
    const double error = (predicted - c.measured) / c.measured;
    worst = std::max(worst, std::fabs(error));
    if (c.mfu)
      std::printf("| %s | %s | %lld | %.0f%% MFU | %.1f%% MFU | %+.0f%% |\n", c.name, c.source, (long long)c.gpus,
                  100 * c.measured, 100 * predicted, 100 * error);
    else
      std::printf("| %s | %s | %lld | %.0f tok/s/GPU | %.0f tok/s/GPU | %+.0f%% |\n", c.name, c.source,
                  (long long)c.gpus, c.measured, predicted, 100 * error);
    INFO(c.name);
    CHECK(std::fabs(error) < 0.30);
  }
  std::printf("worst |error| %.1f%%\n", 100 * worst);
}
