// The JSON output of trainer estimate and trainer plan: a stable, documented schema.
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "estimate/estimate.h"
#include "estimate/plan.h"
#include "estimate/report.h"
#include "estimate_fixture.h"

using namespace trainer::estimate;
using trainer::test::load;
using nlohmann::json;

namespace {

std::set<std::string> keys(const json& object) {
  std::set<std::string> k;
  for (const auto& [key, value] : object.items()) k.insert(key);
  return k;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

json estimate_doc(const std::string& recipe, const std::vector<std::string>& sets, int64_t world, bool cpu) {
  const auto loaded = load(recipe, sets, world);
  const auto& gpu = builtin_profile("h100-sxm");
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, cpu ? nullptr : &gpu);
  ReportContext context;
  context.recipe_path = recipe;
  context.recipe = &loaded.recipe;
  context.gpu = cpu ? nullptr : &gpu;
  return estimate_json(e, context);
}

const std::set<std::string> kTop = {"schema_version", "recipe", "device", "gpu", "world_size", "gpus_per_node", "mesh",
                                    "parallel", "model", "memory", "step_time_s", "tokens_per_step", "tokens_per_s",
                                    "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "time", "documents",
                                    "checkpoints", "assumptions"};
const std::set<std::string> kCheckpoints = {
    "enabled", "async", "interval_steps", "run_steps", "bytes_per_rank", "snapshot_s", "hidden_s", "write_s",
    "stall_s", "min_interval_s", "restart_s", "gpu_mtbf_hours", "job_mtbf_hours", "failures_per_run", "interval_s",
    "lost_per_failure_s", "overhead", "optimum_s", "advised_interval_steps", "advised_interval_s",
    "advised_lost_per_failure_s", "advised_overhead"};
const std::set<std::string> kMemory = {"predicted", "peak_bytes", "peak_bytes_worst_routing", "worst_stage",
                                       "peak_phase", "reserved_bytes", "device_total_bytes", "capacity_bytes", "fits",
                                       "fragmentation_factor", "framework_overhead_bytes", "stages"};
const std::set<std::string> kStage = {"stage", "layers", "moe_layers", "peak_bytes", "peak_phase", "reserved_bytes",
                                      "device_total_bytes", "breakdown"};
const std::set<std::string> kBreakdown = {
    "parameters", "gradients", "optimizer_states", "model_buffers", "cublas_workspace",
    "activations_per_layer", "activations_microbatch", "inflight_chunks", "inflight_microbatches",
    "activations_other_microbatches", "microbatch_peak", "microbatch_peak_at", "logits_and_loss",
    "logits_and_loss_peak", "optimizer_step_transient", "zero2_full_buckets", "zero3_gathered"};
const std::set<std::string> kTime = {"gemm_s", "attention_s", "memory_bound_s", "recompute_s", "tp_comm_s",
                                     "tp_hidden_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "microbatch_s", "bubble_s",
                                     "dp_comm_s", "dp_exposed_s", "param_gather_s", "optimizer_s", "kernels", "host_s",
                                     "host_exposed_s"};
const std::set<std::string> kMesh = {"tp", "cp", "dp", "pp", "vpp", "ep", "etp", "edp", "global_batch_size",
                                     "micro_batch_size", "microbatches"};

}  // namespace

TEST_CASE("estimate with documents: the described lengths' attention work and balance in time and model FLOPs", "[estimate][documents]") {
  const std::vector<std::string> masking = {"data.document_masking=true", "data.document_separator_token=0",
                                            "training.seq_len=8192", "training.micro_batch_size=1",
                                            "training.global_batch_size=64"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), masking.begin(), masking.end());
    return estimate_doc("llama3.2-1b.json", extra, 8, false);
  };
  const auto unknown = with({});
  CHECK(unknown["documents"].is_null());
  const auto cost = with({"data.document_length_median=600", "data.document_length_p99=16000"});
  const auto none = with({"data.document_length_median=600", "data.document_length_p99=16000", "data.balance=\"none\""});
  REQUIRE(cost["documents"].is_object());
  const double fraction = cost["documents"]["attention_work_fraction"];
  CHECK(fraction > 0.3);
  CHECK(fraction < 0.7);
  CHECK(cost["documents"]["max_over_mean_cost"].get<double>() < 1.05);
  CHECK(cost["documents"]["max_over_mean_none"].get<double>() > 1.1);
  const double attention_full = unknown["time"]["breakdown"]["attention_s"], attention_cost = cost["time"]["breakdown"]["attention_s"],
               attention_none = none["time"]["breakdown"]["attention_s"];
  // The documents' share on the busiest rank: below full attention, more without balancing.
  CHECK(attention_cost == Approx(attention_full * fraction * cost["documents"]["max_over_mean_cost"].get<double>()));
  CHECK(attention_none > attention_cost);
  CHECK(cost["step_time_s"].get<double>() < unknown["step_time_s"].get<double>());
}

TEST_CASE("estimate JSON: schema version 1 - every documented key - nothing else", "[estimate]") {
  const auto doc = estimate_doc("llama3-8b.json", {}, 16, false);
  CHECK(doc["schema_version"] == 1);
  CHECK(keys(doc) == kTop);
  CHECK(keys(doc["memory"]) == kMemory);
  CHECK(keys(doc["mesh"]) == kMesh);
  REQUIRE(doc["memory"]["stages"].size() == 1);
  CHECK(keys(doc["memory"]["stages"][0]) == kStage);
  CHECK(keys(doc["memory"]["stages"][0]["breakdown"]) == kBreakdown);
  CHECK(keys(doc["time"]) == std::set<std::string>{"fused_kernels", "breakdown"});
  CHECK(keys(doc["time"]["breakdown"]) == kTime);
  CHECK(keys(doc["checkpoints"]) == kCheckpoints);
  CHECK(doc["memory"]["predicted"] == "allocated");
  for (const char* key : {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"})
    CHECK(doc[key].is_number());
  CHECK(doc["memory"]["peak_bytes"].get<double>() > 1e9);
  CHECK(doc["gpu"]["name"] == "h100-sxm");
}

TEST_CASE("estimate JSON on the CPU: the same keys - time fields null", "[estimate]") {
  const auto doc = estimate_doc("tiny-llama.json", {}, 1, true);
  CHECK(keys(doc) == kTop);
  CHECK(doc["device"] == "cpu");
  CHECK(doc["gpu"].is_null());
  CHECK(doc["time"].is_null());
  CHECK(doc["checkpoints"].is_null());
  for (const char* key : {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"})
    CHECK(doc[key].is_null());
  CHECK(doc["memory"]["capacity_bytes"].is_null());
  CHECK(doc["memory"]["fits"].is_null());
}

TEST_CASE("docs/estimator.md documents every key of the JSON", "[estimate][docs]") {
  const std::string doc = read(std::string(TRAINER_SOURCE_DIR) + "/docs/estimator.md");
  REQUIRE(!doc.empty());
  for (const auto* set : {&kTop, &kMemory, &kStage, &kBreakdown, &kTime, &kMesh, &kCheckpoints}) {
    for (const auto& key : *set) {
      INFO(key);
      CHECK(doc.find("`" + key + "`") != std::string::npos);
    }
  }
  for (const char* key : {"configurations", "overrides", "search_seconds", "memory_margin", "considered", "fitting"}) {
    INFO(key);
    CHECK(doc.find(std::string("`") + key + "`") != std::string::npos);
  }
}

TEST_CASE("estimate is fast: well under a second for the 405B recipe", "[estimate]") {
  const auto loaded = load("llama3.1-405b.json", {}, 2016);
  const auto start = std::chrono::steady_clock::now();
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, &builtin_profile("h100-sxm"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 0.1);
  CHECK(e.stages.size() == 14);
  CHECK(e.has_time);
  WARN("estimate_job for llama3.1-405b on 2016 GPUs: " << seconds * 1e3 << " ms");
}

TEST_CASE("the text report names the peak - the breakdown and the assumptions", "[estimate]") {
  const auto loaded = load("llama3-8b.json", {}, 16);
  const auto& gpu = builtin_profile("h100-sxm");
  const auto e = estimate_job(loaded.recipe, *loaded.mesh, &gpu);
  ReportContext context;
  context.recipe_path = "llama3-8b.json";
  context.recipe = &loaded.recipe;
  context.gpu = &gpu;
  const std::string text = estimate_text(e, context);
  for (const char* part : {"memory per rank", "peak:", "step time:", "MFU", "exposed communication", "assumptions:",
                           "fragmentation", "checkpoints: every 1000 steps", "stall per save", "work lost per failure",
                           "Young's optimum"})
    CHECK(text.find(part) != std::string::npos);
  CHECK(format_bytes(1536.0 * 1024 * 1024) == "1.50 GiB");
  CHECK(format_bytes(2048) == "2.0 KiB");
}
