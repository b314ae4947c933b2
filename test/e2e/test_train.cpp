// Training end to end through `trainer run`: the loss falls, resume is bit-exact, gradient
// accumulation is equivalent to one big micro-batch, signals stop cleanly, divergence and bad data
// are reported.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "jsonl.h"
#include "process.h"

using namespace trainer::test;

namespace {
const std::string kTiny = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-llama.json";
const std::string kTinyMoe = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-moe.json";

// A smaller, faster variant of tiny-llama for tests that only compare runs.
const std::vector<std::string> kSmall = {"model.num_hidden_layers=2", "training.seq_len=64", "logging.interval=1",
                                         "optimizer.warmup_steps=2"};

ProcessResult run(const std::string& recipe, std::vector<std::string> sets, double timeout = 300) {
  std::vector<std::string> argv = {trainer_binary(), "run", recipe};
  for (const auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  // One intra-op thread: ctest runs two tests at once on two cores.
  return run_process(argv, timeout, {"OMP_NUM_THREADS=1"});
}


std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace

TEST_CASE("train: tiny-llama's loss falls toward the printed floor", "[train]") {
  TempDir dir;
  const auto r = run(kTiny, {"training.steps=40", "logging.metrics_file=" + dir.path() + "/m.jsonl"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("loss floor of this data: 1.2080 nats/token") != std::string::npos);
  // Which attention kernel runs (ATen's choice for these heads; on the CPU its flash kernel).
  CHECK(r.out.find("attention: scaled_dot_product_attention on ATen's flash kernel (4 query / 2 key-value heads of 32 "
                   "per rank, fp32)") != std::string::npos);
  const auto m = read_jsonl(dir.path() + "/m.jsonl");
  REQUIRE(m.size() == 8);  // logging.interval 5
  const double first = m.front()["loss"], last = m.back()["loss"];
  CHECK(first > 5.0);
  CHECK(last < 2.6);
  CHECK(last > 1.2);  // never below the entropy floor
  for (const char* key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_device", "mfu",
                          "mem_peak_bytes", "time_s"})
    CHECK(m.back().contains(key));
  CHECK(m.back()["mfu"].is_null());  // CPU: no peak to compare with
  CHECK(m.back()["mem_peak_bytes"].get<int64_t>() > 1000000);
  CHECK(m.back()["step"] == 40);
}

TEST_CASE("train: resume continues with a bit-identical loss sequence", "[train]") {
  TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  const auto full = run(kTiny, with(kSmall, {"training.steps=8", "checkpoint.dir=" + a, "checkpoint.interval=4",
                                             "checkpoint.keep=0", "logging.metrics_file=" + a + "/m.jsonl"}));
  INFO(full.out << full.err);
  REQUIRE(full.exit_code == 0);
  REQUIRE(std::filesystem::exists(a + "/step-00000004/manifest.json"));
  const auto resumed = run(kTiny, with(kSmall, {"training.steps=8", "checkpoint.dir=" + b,
                                                "checkpoint.resume=" + a + "/step-00000004",
                                                "logging.metrics_file=" + b + "/m.jsonl"}));
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.out.find("resumed from") != std::string::npos);
  const auto ma = read_jsonl(a + "/m.jsonl"), mb = read_jsonl(b + "/m.jsonl");
  REQUIRE(ma.size() == 8);
  REQUIRE(mb.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(mb[i]["step"] == ma[4 + i]["step"]);
    CHECK(mb[i]["loss"].get<double>() == ma[4 + i]["loss"].get<double>());  // bit-identical
    CHECK(mb[i]["grad_norm"].get<double>() == ma[4 + i]["grad_norm"].get<double>());
  }
  // checkpoint.resume=auto picks up the latest checkpoint in checkpoint.dir: nothing left to do.
  const auto again = run(kTiny, with(kSmall, {"training.steps=8", "checkpoint.dir=" + a}));
  CHECK(again.exit_code == 0);
  CHECK(again.out.find("nothing to train: checkpoint " + a + "/step-00000008 is at step 8") != std::string::npos);
}

TEST_CASE("train: one micro-batch of 8 and 8 micro-batches of 1 give the same updates", "[train]") {
  TempDir dir;
  const auto one = run(kTiny, with(kSmall, {"training.steps=4", "training.micro_batch_size=8",
                                            "training.global_batch_size=8", "logging.metrics_file=" + dir.path() + "/1.jsonl"}));
  const auto eight = run(kTiny, with(kSmall, {"training.steps=4", "training.micro_batch_size=1",
                                              "training.global_batch_size=8", "logging.metrics_file=" + dir.path() + "/8.jsonl"}));
  REQUIRE(one.exit_code == 0);
  REQUIRE(eight.exit_code == 0);
  const auto m1 = read_jsonl(dir.path() + "/1.jsonl"), m8 = read_jsonl(dir.path() + "/8.jsonl");
  REQUIRE(m1.size() == 4);
  REQUIRE(m8.size() == 4);
  for (int i = 0; i < 4; ++i) {
    INFO("step " << i + 1);
    CHECK(m8[i]["loss"].get<double>() == Approx(m1[i]["loss"].get<double>()).epsilon(1e-5));
    CHECK(m8[i]["grad_norm"].get<double>() == Approx(m1[i]["grad_norm"].get<double>()).epsilon(1e-4));
  }
}

TEST_CASE("train: SIGTERM finishes the step and writes a checkpoint", "[train]") {
  TempDir dir;
  const auto r = run_process({"/usr/bin/timeout", "--preserve-status", "-s", "TERM", "5", trainer_binary(), "run",
                              kTiny, "--set", "training.steps=100000", "--set", "optimizer.warmup_steps=10", "--set",
                              "checkpoint.dir=" + dir.path() + "/ck", "--set", "logging.interval=1"},
                             120, {"OMP_NUM_THREADS=1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("stopping after step") != std::string::npos);
  CHECK(r.out.find("checkpoint ") != std::string::npos);
  CHECK(std::filesystem::exists(dir.path() + "/ck/latest"));
}

TEST_CASE("train: Ctrl-C in a terminal (SIGINT to the whole process group) finishes the step and checkpoints a "
          "multi-worker run", "[train]") {
  // The terminal signals every process of the foreground group: the launcher, which forwards the
  // signal, and each worker. One Ctrl-C must still be one request.
  TempDir dir;
  const std::string script = dir.write("ctrl_c.sh", "cd " + dir.path() + "\n" + trainer_binary() + " run " + kTiny +
      " --nproc-per-node 2 --set training.steps=100000 --set optimizer.warmup_steps=10 --set checkpoint.dir=" +
      dir.path() + "/ck --set logging.interval=1 > out.txt 2> err.txt &\n"
      "P=$!\n"
      "for i in $(seq 1 1200); do grep -q '^step ' out.txt && break; sleep 0.1; done\n"
      "trap '' INT\n"
      "kill -INT -- -$$\n"  // setsid made this shell the leader of a new process group
      "wait $P\n"
      "echo \"exit $?\"\n");
  const auto r = run_process({"/usr/bin/setsid", "--wait", "/bin/bash", script}, 180, {"OMP_NUM_THREADS=1"});
  const std::string out = read_file(dir.path() + "/out.txt"), err = read_file(dir.path() + "/err.txt");
  INFO(r.out << r.err << out << err);
  CHECK(r.out.find("exit 0") != std::string::npos);
  CHECK(out.find("stopping after step") != std::string::npos);
  CHECK(out.find("committed") != std::string::npos);
  CHECK(std::filesystem::exists(dir.path() + "/ck/latest"));
}

TEST_CASE("train: workers split the node's cores unless OMP_NUM_THREADS says otherwise", "[train]") {
  const std::vector<std::string> argv = {trainer_binary(), "run", kTiny, "--nproc-per-node", "2",
                                         "--set", "training.steps=2", "--set", "optimizer.warmup_steps=1"};
  const auto by_default = run_process(argv, 120, {"OMP_NUM_THREADS="});
  INFO(by_default.out << by_default.err);
  REQUIRE(by_default.exit_code == 0);
  CHECK(by_default.out.find("intra-op thread") != std::string::npos);
  const bool split = by_default.out.find("local workers; set OMP_NUM_THREADS to choose)") != std::string::npos ||
                     by_default.out.find("this process is bound to") != std::string::npos;
  CHECK(split);
  const auto chosen = run_process(argv, 120, {"OMP_NUM_THREADS=1"});
  INFO(chosen.out << chosen.err);
  REQUIRE(chosen.exit_code == 0);
  CHECK(chosen.out.find("threads: 1 intra-op thread per worker (OMP_NUM_THREADS=1;") != std::string::npos);
}

TEST_CASE("train: a warm-up longer than the run is a warning and the run trains", "[train]") {
  const auto r = run(kTiny, {"training.steps=3", "model.num_hidden_layers=1"});  // tiny-llama warms up for 10 steps
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("warning: optimizer.warmup_steps=10 exceeds training.steps=3") != std::string::npos);
  CHECK(r.out.find("finished after step 3 of 3") != std::string::npos);
}

TEST_CASE("train: a diverging run stops naming the step and the quantity", "[train]") {
  const auto r = run(kTiny, with(kSmall, {"training.steps=20", "optimizer.lr=1e6", "optimizer.warmup_steps=0",
                                          "training.grad_clip=0"}));
  INFO(r.out << r.err);
  CHECK(r.exit_code == 3);  // kExitDiverged: a restart would only repeat it
  const bool named = r.err.find("the loss is") != std::string::npos || r.err.find("the gradient norm is") != std::string::npos;
  CHECK(named);
  CHECK(r.err.find("step ") != std::string::npos);
}

TEST_CASE("train: missing token files exit 2 naming the file before training", "[train]") {
  const auto r = run(kTiny, {"data.source=tokens", "data.paths=[\"/nonexistent/corpus\"]"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("/nonexistent/corpus") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
}

TEST_CASE("train: document masking on data without boundaries or with a separator outside the vocabulary exits 2 naming the key",
          "[train][documents]") {
  TempDir dir;
  // An llm.c shard (no document index) of 300 tokens.
  std::string shard;
  const auto put = [&shard](auto value) { shard.append(reinterpret_cast<const char*>(&value), sizeof(value)); };
  for (int i = 0; i < 256; ++i) put(int32_t(i == 0 ? 20240520 : i == 1 ? 1 : i == 2 ? 300 : 0));
  for (int t = 0; t < 300; ++t) put(uint16_t(t % 200));
  const std::string path = dir.write("shard_000.bin", shard);
  const auto r = run(kTiny, {"data.source=tokens", "data.paths=[\"" + path + "\"]", "training.seq_len=32",
                             "data.document_masking=true"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(path) != std::string::npos);
  CHECK(r.err.find("data.document_separator_token") != std::string::npos);
  CHECK(r.out.find("step ") == std::string::npos);
  const auto outside = run(kTiny, {"data.document_masking=true", "data.document_separator_token=300"});
  INFO(outside.out << outside.err);
  CHECK(outside.exit_code == 2);
  CHECK(outside.err.find("data.document_separator_token=300") != std::string::npos);
}

TEST_CASE("train: tiny-moe trains and reports its load-balancing loss", "[train]") {
  TempDir dir;
  const auto r = run(kTinyMoe, {"training.steps=20", "logging.interval=5", "logging.metrics_file=" + dir.path() + "/m.jsonl"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const auto m = read_jsonl(dir.path() + "/m.jsonl");
  REQUIRE(m.size() == 4);
  CHECK(m.back()["loss"].get<double>() < m.front()["loss"].get<double>() - 1.0);
  REQUIRE(m.back().contains("aux_loss"));
  CHECK(m.back()["aux_loss"].get<double>() > 0.9);  // 1 is perfect balance per layer, summed over 4 layers
}

TEST_CASE("train: a metrics file that cannot be written ends the run as a failure naming it - not an internal error", "[train]") {
  // /dev/full accepts the open and refuses every write with ENOSPC, as a full disk does.
  const auto r = run(kTiny, {"training.steps=2", "logging.interval=1", "logging.metrics_file=/dev/full"}, 120);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.signal == 0);
  CHECK(r.err.find("training failed: /dev/full: writing the metrics file failed (No space left on device)") !=
        std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
}
