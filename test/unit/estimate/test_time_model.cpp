#include <catch2/catch.hpp>

#include "estimate/estimate.h"
#include "estimate/time_model.h"
#include "estimate_fixture.h"

using namespace trainer::estimate;
using trainer::test::load;

namespace {
const HardwareProfile& h100() { return builtin_profile("h100-sxm"); }
JobEstimate estimate(const std::string& recipe, const std::vector<std::string>& sets, int64_t world,
                     bool fused = false) {
  const auto loaded = load(recipe, sets, world);
  EstimateOptions options;
  options.fused_kernels = fused;
  return estimate_job(loaded.recipe, *loaded.mesh, &h100(), options);
}
}  // namespace

TEST_CASE("GEMM efficiency rises with size toward the profile's maximum", "[estimate]") {
  MeshPlacement placement;
  double previous = 0;
  for (double n : {256.0, 1024.0, 4096.0, 16384.0}) {
    Costs c;
    c.gemms.push_back(GemmShape{n, n, n, 2 * 3 * n * n});
    const double t = segment_time(c, h100(), trainer::recipe::Precision::BF16, placement, false).gemm_s;
    const double efficiency = 2 * n * n * n / t / h100().bf16_flops;
    CHECK(efficiency > previous);
    CHECK(efficiency < h100().gemm_efficiency);
    previous = efficiency;
  }
  CHECK(previous > 0.95 * h100().gemm_efficiency);
  // A thin product is memory-bound: time is bytes over HBM bandwidth.
  Costs thin;
  thin.gemms.push_back(GemmShape{1e6, 8, 8, 2 * (1e6 * 8 + 64 + 8e6)});
  CHECK(segment_time(thin, h100(), trainer::recipe::Precision::BF16, placement, false).gemm_s ==
        Approx(thin.gemms[0].bytes / (h100().hbm_bytes_per_s * h100().hbm_efficiency)));
}

TEST_CASE("a collective with GEMMs behind it shows only the time beyond theirs", "[estimate]") {
  MeshPlacement placement;
  placement.tp.size = 8;  // one NVLink domain
  Costs exposed;
  exposed.comms.push_back(CommOp{CommKind::AllReduce, CommGroup::Tp, 64e6, false, {}});
  const double comm = segment_time(exposed, h100(), trainer::recipe::Precision::BF16, placement, false).tp_comm_s;
  REQUIRE(comm > 0);
  const GemmShape gemm{4096, 4096, 4096, 2 * 3 * 4096.0 * 4096};
  const double gemm_s = [&] {
    Costs c;
    c.gemms.push_back(gemm);
    return segment_time(c, h100(), trainer::recipe::Precision::BF16, placement, false).gemm_s;
  }();
  for (int n : {0, 1, 2, 100}) {
    CAPTURE(n);
    Costs c = exposed;
    c.comms[0].behind.assign(size_t(n), gemm);
    CHECK(segment_time(c, h100(), trainer::recipe::Precision::BF16, placement, false).tp_comm_s ==
          Approx(std::max(0.0, comm - n * gemm_s)).margin(1e-15));
  }
}

TEST_CASE("tensor parallelism: the backward's input-gradient collectives hide behind weight-gradient GEMMs", "[estimate]") {
  // Per micro-batch, tp comm without overlap would be the sum of every collective's time; with the
  // column-parallel backward's overlap it is less, and never negative.
  for (const std::string sp : {"true", "false"}) {
    CAPTURE(sp);
    const auto e = estimate("llama3-8b.json", {"parallel.sequence_parallel=" + sp}, 64);
    REQUIRE(e.has_time);
    CHECK(e.time.tp_comm_s > 0);
    const auto plain = estimate("llama3-8b.json", {"parallel.sequence_parallel=" + sp, "parallel.tp=1"}, 64);
    CHECK(plain.time.tp_comm_s == 0);
  }
}

TEST_CASE("a collective matmul's ring exposes tp - 1 times what of each step one chunk's GEMMs do not hide", "[estimate]") {
  MeshPlacement placement;
  placement.tp.size = 8;
  const double bytes = 64e6;
  Costs plain;
  plain.comms.push_back(CommOp{CommKind::AllGather, CommGroup::Tp, bytes, false, {}});
  const SegmentTime whole = segment_time(plain, h100(), trainer::recipe::Precision::BF16, placement, false);
  // Seven steps of an eighth of the buffer each: the same time as the all-gather, all of it exposed
  // with nothing beside the steps.
  Costs ring = plain;
  ring.comms[0].ring_steps = 7;
  const double link = h100().nvlink.bytes_per_s * h100().nvlink.efficiency;
  const double step = h100().nvlink.latency_s + bytes / 8 / link;
  const SegmentTime alone = segment_time(ring, h100(), trainer::recipe::Precision::BF16, placement, false);
  CHECK(alone.tp_comm_s == Approx(7 * step));
  CHECK(alone.tp_comm_s == Approx(whole.tp_comm_s));
  CHECK(alone.tp_hidden_s == Approx(0).margin(1e-15));
  // One chunk's GEMM beside every step hides up to its own time of each.
  for (const double rows : {64.0, 1024.0, 16384.0}) {
    CAPTURE(rows);
    const GemmShape chunk{rows, 4096, 4096, 2 * (rows * 4096 + 4096.0 * 4096 + rows * 4096)};
    Costs gemm;
    gemm.gemms.push_back(chunk);
    const double chunk_s = segment_time(gemm, h100(), trainer::recipe::Precision::BF16, placement, false).gemm_s;
    Costs c = ring;
    c.comms[0].behind = {chunk};
    const SegmentTime t = segment_time(c, h100(), trainer::recipe::Precision::BF16, placement, false);
    CHECK(t.tp_comm_s == Approx(7 * std::max(0.0, step - chunk_s)).margin(1e-15));
    CHECK(t.tp_comm_s + t.tp_hidden_s == Approx(7 * step));
  }
}

TEST_CASE("collective matmuls (parallel.tp_comm_overlap): less exposed tp time - the same communication - GEMMs in chunks - no gathered copy - nothing without sp",
          "[estimate]") {
  const auto on = estimate("llama3-8b.json", {"parallel.tp=4", "parallel.tp_comm_overlap=true"}, 64);
  const auto off = estimate("llama3-8b.json", {"parallel.tp=4", "parallel.tp_comm_overlap=false"}, 64);
  REQUIRE(on.has_time);
  CHECK(on.time.tp_comm_s < 0.2 * off.time.tp_comm_s);
  CHECK(on.time.tp_hidden_s > off.time.tp_hidden_s);
  // The rings move the same bytes in the same time as the collectives they replace.
  CHECK(on.time.tp_comm_s + on.time.tp_hidden_s == Approx(off.time.tp_comm_s + off.time.tp_hidden_s).epsilon(1e-9));
  // The same FLOPs as more, smaller GEMMs: each chunk pays its own latency.
  CHECK(on.time.gemm_s > off.time.gemm_s);
  CHECK(on.step_time_s < off.step_time_s);
  CHECK(on.peak_bytes <= off.peak_bytes);
  // Without sequence parallelism there is nothing to ring.
  const auto plain_on = estimate("llama3-8b.json", {"parallel.tp=4", "parallel.sequence_parallel=false",
                                                    "parallel.tp_comm_overlap=true"}, 64);
  const auto plain_off = estimate("llama3-8b.json", {"parallel.tp=4", "parallel.sequence_parallel=false",
                                                     "parallel.tp_comm_overlap=false"}, 64);
  CHECK(plain_on.step_time_s == plain_off.step_time_s);
  CHECK(plain_on.time.tp_comm_s == plain_off.time.tp_comm_s);
  CHECK(plain_on.peak_bytes == plain_off.peak_bytes);
}

TEST_CASE("step time: outputs consistent with each other", "[estimate]") {
  const auto e = estimate("llama3-8b.json", {}, 64);
  REQUIRE(e.has_time);
  CHECK(e.step_time_s == Approx(e.time.step_s));
  CHECK(e.tokens_per_s == Approx(e.tokens_per_step / e.step_time_s));
  CHECK(e.tokens_per_s_per_gpu == Approx(e.tokens_per_s / 64));
  CHECK(e.tflops_per_gpu == Approx(e.model_flops_per_step / e.step_time_s / 64 / 1e12));
  CHECK(e.mfu == Approx(e.tflops_per_gpu * 1e12 / h100().bf16_flops));
  CHECK(e.mfu > 0.2);
  CHECK(e.mfu < 0.7);
  const auto& t = e.time;
  CHECK(t.step_s == Approx(t.microbatch_s * double(e.microbatches) + t.bubble_s + t.dp_exposed_s + t.param_gather_s +
                           t.optimizer_s));
  CHECK(t.microbatch_s * double(e.microbatches) ==
        Approx(t.gemm_s + t.attention_s + t.memory_bound_s + t.tp_comm_s + t.cp_comm_s + t.ep_comm_s + t.pp_comm_s));
  CHECK(t.tp_comm_s > 0);  // tp 2 with sequence parallelism
  CHECK(t.dp_exposed_s <= t.dp_comm_s);
}

TEST_CASE("monotonic: more micro-batches - smaller bubble share", "[estimate]") {
  double previous = 1;
  for (int64_t gbs : {64, 128, 256, 512}) {
    const auto e = estimate("llama3-8b.json",
                            {"parallel.tp=1", "parallel.pp=4", "parallel.sequence_parallel=false",
                             "training.global_batch_size=" + std::to_string(gbs)},
                            16);
    const double share = e.time.bubble_s / e.step_time_s;
    CHECK(share < previous);
    previous = share;
  }
}

TEST_CASE("recompute costs time - fused kernels save it - bigger GPUs are faster", "[estimate]") {
  const auto none = estimate("llama3-8b.json", {"training.recompute=none"}, 64);
  const auto full = estimate("llama3-8b.json", {"training.recompute=full"}, 64);
  CHECK(full.step_time_s > none.step_time_s);
  CHECK(full.time.recompute_s > 0);
  CHECK(none.time.recompute_s == 0);
  // The trainer's fused kernels (the recipe's default) and the --fused-kernels what-if (a third of
  // the unfused traffic) both beat the unfused ops; each kernel on its own saves time.
  const auto unfused = estimate("llama3-8b.json", {"training.fused_kernels=[]"}, 64);
  CHECK(estimate("llama3-8b.json", {}, 64, true).step_time_s < unfused.step_time_s);
  CHECK(estimate("llama3-8b.json", {}, 64).step_time_s < unfused.step_time_s);
  for (const std::string kernel : {"rms_norm", "rope", "swiglu", "cross_entropy", "grad_accumulation"}) {
    INFO(kernel);
    CHECK(estimate("llama3-8b.json", {"training.fused_kernels=[\"" + kernel + "\"]"}, 64).step_time_s <
          unfused.step_time_s);
  }
  // --fused-kernels is a what-if of time: memory stays what the recipe's kernels allocate.
  CHECK(estimate("llama3-8b.json", {}, 64, true).peak_bytes == estimate("llama3-8b.json", {}, 64).peak_bytes);
  // The GEMM accumulates into fp32 gradients only: with bf16 ones the kernel changes nothing.
  const auto bf16_grads = estimate("llama3-8b.json", {"parallel.grad_reduce_dtype=bf16", "training.fused_kernels=[]"}, 64);
  const auto bf16_fused =
      estimate("llama3-8b.json", {"parallel.grad_reduce_dtype=bf16", "training.fused_kernels=[\"grad_accumulation\"]"}, 64);
  CHECK(bf16_fused.step_time_s == bf16_grads.step_time_s);
  CHECK(bf16_fused.peak_bytes == bf16_grads.peak_bytes);
  const auto loaded = load("llama3-8b.json", {}, 64);
  const auto a100 = estimate_job(loaded.recipe, *loaded.mesh, &builtin_profile("a100-80g"));
  const auto b200 = estimate_job(loaded.recipe, *loaded.mesh, &builtin_profile("b200"));
  CHECK(a100.step_time_s > estimate("llama3-8b.json", {}, 64).step_time_s);
  CHECK(b200.step_time_s < estimate("llama3-8b.json", {}, 64).step_time_s);
}

TEST_CASE("the host term - tiny models are launch-bound - large ones GPU-bound", "[estimate]") {
  const auto tiny = estimate("tiny-llama.json", {"training.dtype=bf16"}, 1);
  CHECK(tiny.time.kernels > 100);
  CHECK(tiny.time.host_s == Approx(tiny.time.kernels * h100().host_s_per_kernel));
  CHECK(tiny.time.host_exposed_s > 0);
  CHECK(tiny.step_time_s == Approx(tiny.time.host_s));  // the GPU waits for the host
  const auto large = estimate("llama3-8b.json", {}, 64);
  CHECK(large.time.host_s > 0);
  CHECK(large.time.host_exposed_s == 0);
  CHECK(large.time.host_s < large.step_time_s);
  // Fewer kernels with the fused ones: less host time.
  CHECK(estimate("tiny-llama.json", {"training.dtype=bf16", "training.fused_kernels=[]"}, 1).time.kernels >
        tiny.time.kernels);
}

TEST_CASE("data parallelism across nodes costs more than inside one", "[estimate]") {
  const auto inside = estimate("llama3-8b.json", {"parallel.zero=0", "hardware.gpus_per_node=64"}, 64);
  const auto across = estimate("llama3-8b.json", {"parallel.zero=0", "hardware.gpus_per_node=8"}, 64);
  CHECK(across.time.dp_comm_s > inside.time.dp_comm_s);
}
