#include <catch2/catch.hpp>

#include "estimate/estimate.h"
#include "estimate_fixture.h"

using namespace trainer::estimate;
using trainer::test::load;

namespace {
const HardwareProfile& h100() { return builtin_profile("h100-sxm"); }
}  // namespace

TEST_CASE("tiny-llama on the CPU: the measured peak of the byte-counting allocator", "[estimate]") {
  // trainer run recipes/tiny-llama.json --cpu (fp32, 803,968 parameters) measured 35,653,912 bytes
  // (36,311,320 before the head and loss ran in chunks, when their backward was the peak; 29,231,384
  // with training.recompute=selective's lean layers);
  // test/e2e/test_estimate.cpp repeats the measurement on many configurations.
  const auto loaded = load("tiny-llama.json", {}, 1);
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, nullptr);
  CHECK(e.peak_bytes == Approx(35653912).epsilon(0.001));
  CHECK(e.stages.at(0).peak_phase == "backward of layer 3");
  CHECK_FALSE(e.has_time);
  CHECK(e.device == "cpu");
}

TEST_CASE("model state by hand: parameters - gradients - AdamW states - ZeRO 0-3", "[estimate]") {
  // tiny-llama: 803,968 parameters in 39 tensors; 2 * 128 + 4 * 256 norm weights... trained in bf16.
  const int64_t P = 803968, tensors = 39;
  for (int64_t zero = 0; zero <= 3; ++zero) {
    const auto loaded = load("tiny-llama.json", {"training.dtype=bf16", "parallel.zero=" + std::to_string(zero)}, 4);
    const auto e = estimate_job(loaded.recipe, *loaded.mesh, &h100());
    const auto& s = e.stages.at(0);
    INFO("zero " << zero);
    const double n = 4;  // dp
    CHECK(s.parameters == Approx(2.0 * P / (zero >= 3 ? n : 1)));
    // fp32 gradient buffers (parallel.grad_reduce_dtype fp32, the default).
    CHECK(s.gradients == Approx(4.0 * P / (zero >= 2 ? n : 1)));
    CHECK(s.optimizer_states == Approx(12.0 * P / (zero >= 1 ? n : 1) + 4.0 * tensors));
  }
  // bf16 gradient buffers on request.
  const auto bf16_reduce = load("tiny-llama.json", {"training.dtype=bf16", "parallel.grad_reduce_dtype=bf16"}, 4);
  CHECK(estimate_job(bf16_reduce.recipe, *bf16_reduce.mesh, &h100()).stages.at(0).gradients == Approx(2.0 * P));
  // Trained in fp32, ZeRO's distributed optimizer keeps no master shard (the parameters' shard is
  // updated in place): 8 bytes of moments per parameter of its shard, in every stage. Its step
  // gathers the updated shards in place, into the buckets themselves (Gloo too): no transient.
  for (int64_t zero = 1; zero <= 3; ++zero) {
    const auto fp32_zero = load("tiny-llama.json", {"parallel.zero=" + std::to_string(zero)}, 4);
    const auto z = estimate_job(fp32_zero.recipe, *fp32_zero.mesh, nullptr).stages.at(0);
    INFO("fp32 zero " << zero);
    CHECK(z.optimizer_states == Approx(8.0 * P / 4 + 4.0 * tensors));
    CHECK(z.optimizer_step_transient == 0);
  }
  // Without data parallelism ZeRO-1 is plain AdamW.
  const auto alone = load("tiny-llama.json", {"parallel.zero=1"}, 1);
  CHECK(estimate_job(alone.recipe, *alone.mesh, nullptr).stages.at(0).optimizer_states ==
        Approx(8.0 * P + 4.0 * tensors));
  // fp32 keeps no master copy: 8 bytes of moments per parameter.
  const auto fp32 = load("tiny-llama.json", {}, 1);
  const auto e = estimate_job(fp32.recipe, *fp32.mesh, nullptr);
  CHECK(e.stages.at(0).optimizer_states == Approx(8.0 * P + 4.0 * tensors));
  CHECK(e.stages.at(0).optimizer_step_transient == 0);
  // bf16 with fp32 gradient buffers: no copy in the step; with bf16 buffers AdamW copies the
  // weight-decay group's gradients to fp32.
  const auto bf16 = load("tiny-llama.json", {"training.dtype=bf16"}, 1);
  CHECK(estimate_job(bf16.recipe, *bf16.mesh, nullptr).stages.at(0).optimizer_step_transient == 0);
  const auto bf16_grads = load("tiny-llama.json", {"training.dtype=bf16", "parallel.grad_reduce_dtype=bf16"}, 1);
  const int64_t norms = 2 * 128 * 4 + 128;
  CHECK(estimate_job(bf16_grads.recipe, *bf16_grads.mesh, nullptr).stages.at(0).optimizer_step_transient ==
        Approx(4.0 * (P - norms)));
}

TEST_CASE("monotonic: more tp - fewer weight bytes per rank", "[estimate]") {
  double previous = 1e30;
  for (int64_t tp : {1, 2, 4, 8}) {
    const auto loaded = load("llama3-8b.json", {"parallel.tp=" + std::to_string(tp)}, 64);
    const auto e = estimate_job(loaded.recipe, *loaded.mesh, &h100());
    const double weights = e.stages.at(0).parameters;
    INFO("tp " << tp);
    CHECK(weights < previous);
    previous = weights;
  }
}

TEST_CASE("monotonic: more recompute - less activation memory", "[estimate]") {
  for (const char* dtype : {"bf16", "fp32"}) {
    double previous = 1e30, previous_layer = 1e30;
    for (const char* recompute : {"none", "selective", "full"}) {
      const auto loaded = load("llama3-8b.json", {std::string("training.recompute=") + recompute,
                                                  std::string("training.dtype=") + dtype}, 64);
      const auto e = estimate_job(loaded.recipe, *loaded.mesh, &h100());
      INFO(dtype << " " << recompute);
      CHECK(e.stages.at(0).activations_per_layer_dense < previous_layer);
      CHECK(e.peak_bytes < previous);
      previous = e.peak_bytes;
      previous_layer = e.stages.at(0).activations_per_layer_dense;
    }
  }
}

TEST_CASE("monotonic: bigger micro-batches and longer sequences - more activations - cp splits them", "[estimate]") {
  auto peak = [](std::vector<std::string> sets, int64_t world) {
    const auto loaded = load("llama3-8b.json", sets, world);
    return estimate_job(loaded.recipe, *loaded.mesh, &h100()).peak_bytes;
  };
  CHECK(peak({"training.micro_batch_size=2"}, 64) > peak({"training.micro_batch_size=1"}, 64));
  CHECK(peak({"training.seq_len=4096"}, 64) < peak({}, 64));
  CHECK(peak({"parallel.cp=2"}, 64) < peak({}, 64));
  CHECK(peak({"parallel.zero=3"}, 64) < peak({"parallel.zero=1"}, 64));
}

TEST_CASE("pipeline: stage 0 of 1F1B holds pp micro-batches - GPipe all of them", "[estimate]") {
  const std::vector<std::string> sets = {"parallel.tp=1", "parallel.pp=4", "parallel.sequence_parallel=false",
                                         "training.global_batch_size=64"};
  const auto loaded = load("llama3-8b.json", sets, 16);  // dp 4: 16 micro-batches per step
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, &h100());
  REQUIRE(e.stages.size() == 4);
  for (int64_t r = 0; r < 4; ++r) {
    CHECK(e.stages[size_t(r)].inflight_chunks == 4 - r);
    // The balanced split counts the LM head (128256 x 4096, 2.4 layers of work) on the last stage.
    CHECK(e.stages[size_t(r)].layers == std::vector<int64_t>{9, 9, 8, 6}[size_t(r)]);
  }
  CHECK(e.stages[0].activations_other_microbatches == Approx(3 * e.stages[0].activations_microbatch));
  auto gpipe_sets = sets;
  gpipe_sets.push_back("parallel.pipeline_schedule=gpipe");
  const auto gpipe = load("llama3-8b.json", gpipe_sets, 16);
  const auto g = estimate_job(gpipe.recipe, *gpipe.mesh, &h100());
  CHECK(g.stages[0].inflight_chunks == 16);
  CHECK(g.peak_bytes > e.peak_bytes);
  auto interleaved = sets;
  interleaved.push_back("parallel.pipeline_schedule=interleaved_1f1b");
  interleaved.push_back("parallel.vpp=2");
  const auto il = load("llama3-8b.json", interleaved, 16);
  const auto i = estimate_job(il.recipe, *il.mesh, &h100());
  CHECK(i.stages[0].inflight_chunks == 2 * 3 + 4 + 1);          // 11 chunks of half a stage
  CHECK(i.stages[0].inflight_microbatches == Approx(5.5));
  // The first stage holds the embedding, the last the LM head and loss.
  CHECK(e.stages[3].logits_and_loss > 0);
  CHECK(e.stages[0].logits_and_loss == 0);
}

TEST_CASE("MoE: worst-case routing costs more than balanced", "[estimate]") {
  // Expert parallelism 4: in the worst case one rank's experts get the tokens of all four ranks.
  const auto loaded = load("tiny-moe.json", {"parallel.ep=4", "training.global_batch_size=32"}, 8);
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, &h100());
  CHECK(e.stages.at(0).moe_layers == 4);
  CHECK(e.stages.at(0).activations_per_layer_moe > e.stages.at(0).activations_per_layer_dense);
  CHECK(e.peak_bytes_worst_routing > e.peak_bytes);
  // Mixtral's recipe peaks in the optimizer step, where routing does not matter.
  const auto mixtral = load("mixtral-8x7b.json", {}, 64);
  const auto m = estimate_job(mixtral.recipe, *mixtral.mesh, &h100());
  CHECK(m.peak_bytes_worst_routing >= m.peak_bytes);
}

TEST_CASE("reserved and device total follow the profile's fragmentation and overhead", "[estimate]") {
  const auto loaded = load("llama3-8b.json", {}, 8);
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, &h100());
  CHECK(e.reserved_bytes == Approx(e.peak_bytes * h100().fragmentation));
  CHECK(e.device_total_bytes == Approx(e.reserved_bytes + h100().framework_overhead_bytes));
  CHECK(e.capacity_bytes == h100().memory_bytes);
  CHECK(e.fits == (e.device_total_bytes <= e.capacity_bytes));
  CHECK(e.stages.at(0).cublas_workspace == h100().cublas_workspace_bytes);
}
