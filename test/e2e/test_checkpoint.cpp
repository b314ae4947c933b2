// Checkpoint integrity through the binary: ckpt inspect verifies; truncated, corrupted or missing
// files are errors naming the file; an uncommitted step directory is skipped with a warning.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "process.h"

using namespace trainer::test;

namespace {
const std::string kTiny = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-llama.json";

std::string make_checkpoint(const TempDir& dir, int steps = 2) {
  const std::string ck = dir.path() + "/ck";
  const auto r = run_process({trainer_binary(), "run", kTiny, "--set", "training.steps=" + std::to_string(steps), "--set",
                              "optimizer.warmup_steps=1", "--set", "checkpoint.dir=" + ck, "--set", "model.num_hidden_layers=1",
                              "--set", "training.seq_len=32"},
                             120, {"OMP_NUM_THREADS=1"});
  REQUIRE(r.exit_code == 0);
  return ck;
}
}  // namespace

TEST_CASE("ckpt inspect prints the step and tensors and verifies the files", "[checkpoint]") {
  TempDir dir;
  const auto ck = make_checkpoint(dir);
  const auto r = run_process({trainer_binary(), "ckpt", "inspect", ck});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("step 2, 32 samples consumed") != std::string::npos);
  CHECK(r.out.find("model.embed_tokens.weight") != std::string::npos);
  CHECK(r.out.find("[256,128]") != std::string::npos);
  CHECK(r.out.find("CRC-32 verified") != std::string::npos);
}

TEST_CASE("a corrupted - truncated or missing shard is an error naming the file", "[checkpoint]") {
  TempDir dir;
  const auto ck = make_checkpoint(dir);
  const std::string shard = ck + "/step-00000002/shard-00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    f.put('\x7f');
  }
  auto r = run_process({trainer_binary(), "ckpt", "inspect", ck});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(shard + ": CRC-32") != std::string::npos);
  std::filesystem::resize_file(shard, 1000);
  r = run_process({trainer_binary(), "ckpt", "inspect", ck});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(shard + ": 1000 bytes") != std::string::npos);
  // Resuming from it is refused the same way, before training.
  r = run_process({trainer_binary(), "run", kTiny, "--set", "checkpoint.dir=" + ck, "--set", "model.num_hidden_layers=1",
                   "--set", "training.seq_len=32"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(shard) != std::string::npos);
  std::filesystem::remove(shard);
  r = run_process({trainer_binary(), "ckpt", "inspect", ck});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find(shard + ": missing") != std::string::npos);
}

TEST_CASE("a step directory without a committed manifest is skipped with a warning", "[checkpoint]") {
  TempDir dir;
  const auto ck = make_checkpoint(dir);
  std::filesystem::create_directories(ck + "/step-00000009");  // an interrupted save
  std::filesystem::remove(ck + "/latest");
  const auto r = run_process({trainer_binary(), "ckpt", "inspect", ck});
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("skipping " + ck + "/step-00000009: no committed manifest") != std::string::npos);
  CHECK(r.out.find("step 2,") != std::string::npos);
}

TEST_CASE("a checkpoint write that fails (full disk) is a clear error and the previous one stays intact", "[checkpoint]") {
  TempDir dir;
  const std::string mount = dir.path() + "/small";
  std::filesystem::create_directories(mount);
  // 4 MiB: room for one checkpoint of this model (about 2.6 MB) but not for a second beside it.
  const auto m = run_process({"/bin/mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount});
  INFO(m.err);
  REQUIRE(m.exit_code == 0);  // the suite runs as root (scripts/setup installs packages as root too)
  const auto r = run_process({trainer_binary(), "run", kTiny, "--set", "training.steps=4", "--set",
                              "optimizer.warmup_steps=1", "--set", "checkpoint.dir=" + mount + "/ck", "--set",
                              "checkpoint.interval=2", "--set", "model.num_hidden_layers=1", "--set", "training.seq_len=32"},
                             120, {"OMP_NUM_THREADS=1"});
  const auto inspect = run_process({trainer_binary(), "ckpt", "inspect", mount + "/ck"});
  const auto leftovers = run_process({"/bin/ls", mount + "/ck"});
  run_process({"/bin/umount", mount});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("writing the checkpoint to " + mount + "/ck failed") != std::string::npos);
  CHECK(r.err.find("the previous checkpoint is intact") != std::string::npos);
  INFO(inspect.out << inspect.err);
  CHECK(inspect.exit_code == 0);
  CHECK(inspect.out.find("step 2,") != std::string::npos);
  CHECK(leftovers.out.find(".tmp") == std::string::npos);  // no half-written directory left behind
}

TEST_CASE("SIGKILL during an asynchronous write - then resume loads a committed checkpoint", "[checkpoint]") {
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  // Kill the run while a background write is in flight: once the second one has started (a save
  // waits for the previous one, so the first is committed by then), after several delays.
  for (const char* delay : {"0", "0.05", "0.2"}) {
    const auto r = run_process(
        {"/bin/bash", "-c",
         trainer_binary() + " run " + kTiny + " --set training.steps=1000 --set optimizer.warmup_steps=1 " +
             "--set checkpoint.dir=" + ck + " --set checkpoint.interval=1 --set checkpoint.keep=2 " +
             "--set logging.interval=1 > " + dir.path() + "/out.txt 2>&1 & P=$!; " +
             "for i in $(seq 1 600); do [ \"$(grep -c 'writing in the background' " + dir.path() +
             "/out.txt 2>/dev/null)\" -ge 2 ] && break; sleep 0.05; done; sleep " + delay +
             "; kill -KILL $P; wait $P; exit 0"},
        120, {"OMP_NUM_THREADS=1"});
    REQUIRE(r.exit_code == 0);
    const auto resumed = run_process({trainer_binary(), "run", kTiny, "--set", "training.steps=1000", "--set",
                                      "optimizer.warmup_steps=1", "--set", "checkpoint.dir=" + ck, "--set",
                                      "training.steps=1"},
                                     120, {"OMP_NUM_THREADS=1"});
    INFO("delay " << delay << ": " << resumed.out << resumed.err);
    CHECK(resumed.exit_code == 0);
    CHECK(resumed.out.find("resumed from " + ck + "/step-") != std::string::npos);
  }
}
