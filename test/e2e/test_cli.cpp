// The trainer binary end to end: exit codes, help, version and validate output.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "process.h"

using namespace trainer::test;

namespace {
ProcessResult run_trainer(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {trainer_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, 60);
}
const std::string kTiny = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-llama.json";
}  // namespace

TEST_CASE("trainer --help and every subcommand's --help exit 0", "[cli]") {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--help"},
                                                                {"run", "--help"},
                                                                {"validate", "--help"},
                                                                {"estimate", "--help"},
                                                                {"plan", "--help"},
                                                                {"schedule", "--help"},
                                                                {"ckpt", "--help"},
                                                                {"ckpt", "inspect", "--help"},
                                                                {"ckpt", "export", "--help"},
                                                                {"data", "inspect", "--help"}}) {
    const auto r = run_trainer(args);
    INFO(args[0] << " " << r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("Usage") != std::string::npos);
  }
}

TEST_CASE("trainer --version prints version - commit - libtorch - CUDA and NCCL", "[cli]") {
  const auto r = run_trainer({"--version"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("trainer 0.1.0 (commit ") == 0);
  CHECK(r.out.find("libtorch 2.11.0") != std::string::npos);
  CHECK(r.out.find("CUDA: ") != std::string::npos);
  CHECK(r.out.find("NCCL: ") != std::string::npos);
}

TEST_CASE("usage errors exit 2", "[cli]") {
  CHECK(run_trainer({}).exit_code == 2);
  CHECK(run_trainer({"frobnicate"}).exit_code == 2);
  CHECK(run_trainer({"validate"}).exit_code == 2);
  CHECK(run_trainer({"validate", kTiny, "--world-size", "0"}).exit_code == 2);
  CHECK(run_trainer({"validate", kTiny, "--bogus"}).exit_code == 2);
  CHECK(run_trainer({"plan", kTiny}).exit_code == 2);  // --gpus is required
}


TEST_CASE("validate prints the resolved recipe as JSON", "[cli]") {
  const auto r = run_trainer({"validate", kTiny, "--set", "training.steps=17", "--json"});
  REQUIRE(r.exit_code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["recipe"]["training"]["steps"] == 17);
  CHECK(doc["recipe"]["model"]["head_dim"] == 32);
  CHECK(doc["mesh"].is_null());
}

TEST_CASE("validate --world-size prints the mesh", "[cli]") {
  const auto r = run_trainer({"validate", kTiny, "--world-size", "2", "--json"});
  REQUIRE(r.exit_code == 0);
  const auto doc = nlohmann::json::parse(r.out);
  CHECK(doc["mesh"]["dp"] == 2);
  CHECK(doc["mesh"]["world_size"] == 2);
  const auto text = run_trainer({"validate", kTiny, "--world-size", "2"});
  CHECK(text.exit_code == 0);
  CHECK(text.out.find("mesh for world size 2") != std::string::npos);
  CHECK(text.out.find("tp=1 cp=1 dp=2 pp=1") != std::string::npos);
}

TEST_CASE("validate with --set KEY=VALUE takes one value per flag before the recipe", "[cli]") {
  const auto r = run_trainer({"validate", "--set", "training.steps=19", kTiny, "--json"});
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out)["recipe"]["training"]["steps"] == 19);
}

TEST_CASE("bad recipes exit 2 with the file - path and problem", "[cli]") {
  TempDir dir;
  const auto malformed = dir.write("bad.json", "{\n  \"model\": {\n    \"vocab_size\": 12,\n  }\n}\n");
  auto r = run_trainer({"validate", malformed});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(malformed + ":4:3: malformed JSON") != std::string::npos);
  r = run_trainer({"validate", kTiny, "--set", "parallel.tpp=2"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("did you mean parallel.tp?") != std::string::npos);
  r = run_trainer({"validate", kTiny, "--world-size", "3"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("training.global_batch_size=16 is not a multiple of training.micro_batch_size * dp") !=
        std::string::npos);
  r = run_trainer({"validate", dir.path() + "/missing.json"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("missing.json: cannot open recipe file") != std::string::npos);
  r = run_trainer({"validate", dir.path()});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("is a directory") != std::string::npos);
}

TEST_CASE("validate --world-size lists the ranks of every group (Megatron's 16-rank example)", "[cli]") {
  TempDir dir;
  const auto recipe = dir.write("m16.json", R"({"model": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "moe": {"num_local_experts": 8}},
    "parallel": {"tp": 2, "cp": 2, "pp": 2, "ep": 4, "etp": 1, "sequence_parallel": true},
    "training": {"seq_len": 64, "micro_batch_size": 1, "global_batch_size": 8, "steps": 10}})");
  const auto r = run_trainer({"validate", recipe, "--world-size", "16", "--json"});
  REQUIRE(r.exit_code == 0);
  const auto mesh = nlohmann::json::parse(r.out)["mesh"];
  CHECK(mesh["dp"] == 2);
  CHECK(mesh["edp"] == 2);
  CHECK(mesh["groups"]["dp"][0] == nlohmann::json::array({0, 4}));
  CHECK(mesh["groups"]["ep"][1] == nlohmann::json::array({4, 5, 6, 7}));
  CHECK(mesh["groups"]["pp"][7] == nlohmann::json::array({7, 15}));
  const auto text = run_trainer({"validate", recipe, "--world-size", "16"});
  CHECK(text.out.find("dp_cp      4 x 4: [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15]") != std::string::npos);
}

TEST_CASE("run --dry-run is trainer estimate at the run's world size", "[cli]") {
  const auto dry = run_trainer({"run", kTiny, "--dry-run", "--nproc-per-node", "2", "--cpu"});
  const auto est = run_trainer({"estimate", kTiny, "--world-size", "2", "--cpu"});
  INFO(dry.err);
  CHECK(dry.exit_code == 0);
  CHECK(est.exit_code == 0);
  CHECK(dry.out == est.out);
}

TEST_CASE("run --dry-run predicts the run this machine would do", "[cli]") {
  const auto dry = run_trainer({"run", kTiny, "--dry-run"});
  INFO(dry.out << dry.err);
  REQUIRE(dry.exit_code == 0);
  // Without a GPU, run trains on the CPU: the dry run is estimate --cpu, and its hint is an option run has.
  const auto cpu = run_trainer({"estimate", kTiny, "--cpu"});
  const auto gpu = run_trainer({"estimate", kTiny});
  const bool has_gpu = run_trainer({"--version"}).out.find("NCCL: not linked") == std::string::npos &&
                       run_trainer({"--version"}).out.find("no usable CUDA device") == std::string::npos;
  if (!has_gpu) {
    CHECK(dry.out.find("--world-size") == std::string::npos);
    std::string expected = cpu.out;
    for (size_t at; (at = expected.find("--world-size N")) != std::string::npos;)
      expected.replace(at, 14, "--nproc-per-node N");
    CHECK(dry.out == expected);
  }
  CHECK(gpu.exit_code == 0);
}

TEST_CASE("command-line mistakes get messages a user can act on", "[cli]") {
  auto r = run_trainer({"validate", kTiny, "--world-size", "0"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("expected a positive integer, found \"0\"") != std::string::npos);
  r = run_trainer({"run", kTiny, "--steps", "10"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("error: unexpected arguments: --steps 10; recipe values are set with --set, e.g. --set "
                   "training.steps=10") != std::string::npos);
  r = run_trainer({"estimate", kTiny, "--gpu", "h100"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("did you mean \"h100-sxm\"") != std::string::npos);
  // Every line of a multi-problem error reads "error: ...".
  r = run_trainer({"validate", kTiny, "--set", "parallel.tp=4", "--set", "optimizer.min_lr=1"});
  CHECK(r.exit_code == 2);
  size_t lines = 0, prefixed = 0;
  for (size_t start = 0, end; start < r.err.size(); start = end + 1) {
    end = r.err.find('\n', start);
    if (end == std::string::npos) end = r.err.size();
    if (end == start) continue;
    ++lines;
    if (r.err.compare(start, 7, "error: ") == 0) ++prefixed;
  }
  CHECK(lines >= 2);
  CHECK(prefixed == lines);
  // A launch per host needs node 0's address and port, and a node rank inside --nnodes.
  if (!std::getenv("MASTER_ADDR")) {
    r = run_trainer({"run", kTiny, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--nnodes 2 needs MASTER_ADDR and MASTER_PORT") != std::string::npos);
  }
  r = run_trainer({"run", kTiny, "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--node-rank 2 is not a node of --nnodes 2; use 0 to 1") != std::string::npos);
  // NCCL without a GPU (every worker refuses before the rendezvous; a worker's refusal ends the job).
  r = run_trainer({"run", kTiny, "--cpu", "--set", "parallel.backend=nccl", "--set", "training.steps=1"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("parallel.backend=\"nccl\" needs a GPU for every rank, but --cpu was given; use "
                   "parallel.backend=\"auto\" or \"gloo\"") != std::string::npos);
  CHECK(r.err.find("tiny-llama.json") != std::string::npos);
}

TEST_CASE("a rendezvous timeout is one line naming the address - the ranks that joined and the timeout", "[cli]") {
  const auto r = run_process({trainer_binary(), "run", kTiny, "--set", "parallel.collective_timeout_s=2"}, 60,
                             {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                              "MASTER_PORT=29561", "OMP_NUM_THREADS=1"});
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("rank 0: no rendezvous at 127.0.0.1:29561 (address from MASTER_ADDR) within 2 s") !=
        std::string::npos);
  CHECK(r.err.find("only 1 of 2 ranks present") != std::string::npos);
  CHECK(r.err.find("Exception raised from") == std::string::npos);  // no C++ stack frames
  CHECK(r.err.find("frame #") == std::string::npos);
}

TEST_CASE("schedule draws a pipeline: text chart - JSON - Chrome trace - bad input exits 2", "[cli][pipeline]") {
  const auto text = run_trainer({"schedule", "--pp", "4", "--microbatches", "8", "--schedule", "zero_bubble"});
  INFO(text.err);
  REQUIRE(text.exit_code == 0);
  CHECK(text.out.find("stage 3  |") != std::string::npos);
  CHECK(text.out.find("step time 27") != std::string::npos);  // 24 units of work + pp - 1 idle
  const auto json = run_trainer({"schedule", "--pp", "2", "--microbatches", "3", "--schedule", "1f1b", "--json"});
  REQUIRE(json.exit_code == 0);
  const auto doc = nlohmann::json::parse(json.out);
  CHECK(doc["stages"][0]["actions"] ==
        "F0c0 sendF0c0 F1c0 sendF1c0 recvB0c1 B0c0 F2c0 sendF2c0 recvB1c1 B1c0 recvB2c1 B2c0");
  CHECK(doc["stages"][1]["peak_in_flight_chunks"] == 1);
  TempDir dir;
  const std::string trace = dir.path() + "/t.json";
  REQUIRE(run_trainer({"schedule", "--pp", "4", "--vpp", "2", "--microbatches", "8", "--schedule", "interleaved_1f1b",
                       "--trace", trace})
              .exit_code == 0);
  std::ifstream in(trace);
  const auto events = nlohmann::json::parse(in)["traceEvents"];
  CHECK(events.size() >= size_t(4 * 8 * 2 * 2));  // a forward and a backward per micro-batch, chunk and stage
  CHECK(run_trainer({"schedule", "--pp", "3", "--vpp", "2", "--microbatches", "2", "--schedule", "interleaved_1f1b"})
            .exit_code == 2);
  CHECK(run_trainer({"schedule", "--pp", "2", "--microbatches", "3", "--schedule", "nope"}).exit_code == 2);
  // A schedule no pipeline runs is refused at once (it ran unbounded before).
  const auto huge = run_trainer({"schedule", "--pp", "4", "--microbatches", "100000000", "--schedule", "1f1b"});
  CHECK(huge.exit_code == 2);
  CHECK(huge.seconds < 10);
  CHECK(huge.err.find("must be at most") != std::string::npos);
  CHECK(run_trainer({"schedule", "--pp", "2", "--microbatches", "3", "--schedule", "1f1b", "--costs", "1,x"}).exit_code == 2);
  // Costs per model chunk: pp 2 x 1 micro-batch, F 1 then 3, full backward 2 + 0 then 4 + 0:
  // 1 + 3 + 4 + 2 = 10.
  const auto per_chunk = run_trainer(
      {"schedule", "--pp", "2", "--microbatches", "1", "--schedule", "1f1b", "--costs", "1,2,0:3,4,0", "--json"});
  INFO(per_chunk.err);
  REQUIRE(per_chunk.exit_code == 0);
  const auto timeline = nlohmann::json::parse(per_chunk.out)["stages"];
  CHECK(timeline[0]["busy"].get<double>() + timeline[0]["idle"].get<double>() == Approx(10));
  const auto wrong_count =
      run_trainer({"schedule", "--pp", "2", "--microbatches", "1", "--schedule", "1f1b", "--costs", "1,1,1:1,1,1:1,1,1"});
  CHECK(wrong_count.exit_code == 2);
  CHECK(wrong_count.err.find("3 per-chunk entries") != std::string::npos);
}
