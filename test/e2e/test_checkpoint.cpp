// Checkpoint integrity through the binary: ckpt inspect verifies; truncated, corrupted or missing
// files are errors naming the file; an uncommitted step directory is skipped with a warning.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

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
    // The latest committed checkpoint is found (and is past training.steps=1) and verifies.
    CHECK(resumed.out.find("nothing to train: checkpoint " + ck + "/step-") != std::string::npos);
    const auto inspected = run_process({trainer_binary(), "ckpt", "inspect", ck});
    INFO(inspected.out << inspected.err);
    CHECK(inspected.exit_code == 0);
  }
}

namespace {
ProcessResult run_tiny(const std::vector<std::string>& sets) {
  std::vector<std::string> argv = {trainer_binary(), "run", kTiny, "--set", "optimizer.warmup_steps=1", "--set",
                                   "training.seq_len=32"};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return run_process(argv, 120, {"OMP_NUM_THREADS=1"});
}
}  // namespace

TEST_CASE("a checkpoint.dir that cannot be written is refused before the first step", "[checkpoint]") {
  TempDir dir;
  dir.write("a-file", "x");
  const auto under_file = run_tiny({"training.steps=2", "checkpoint.dir=" + dir.path() + "/a-file/ck"});
  INFO(under_file.out << under_file.err);
  CHECK(under_file.exit_code == 2);
  CHECK(under_file.err.find("error: checkpoint.dir " + dir.path() + "/a-file/ck: cannot be created") !=
        std::string::npos);
  CHECK(under_file.out.find("step ") == std::string::npos);  // nothing trained

  if (::geteuid() != 0) {  // root writes anywhere; the read-only case needs another user
    std::filesystem::create_directories(dir.path() + "/ro");
    std::filesystem::permissions(dir.path() + "/ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    const auto read_only = run_tiny({"training.steps=2", "checkpoint.dir=" + dir.path() + "/ro"});
    CHECK(read_only.exit_code == 2);
    CHECK(read_only.err.find("cannot create a file in it") != std::string::npos);
  }
  // A full disk: a 1 MiB tmpfs holds the probe but not a checkpoint.
  const std::string mount = dir.path() + "/small";
  std::filesystem::create_directories(mount);
  if (run_process({"/bin/mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mount}).exit_code == 0) {
    const auto full = run_tiny({"training.steps=2", "checkpoint.dir=" + mount + "/ck"});
    run_process({"/bin/umount", mount});
    INFO(full.out << full.err);
    CHECK(full.exit_code == 2);
    CHECK(full.err.find("MiB free, but a checkpoint needs about") != std::string::npos);
    CHECK(full.out.find("step ") == std::string::npos);
  } else {
    WARN("cannot mount a tmpfs here; the full-disk case is not checked");
  }
}

TEST_CASE("resuming a checkpoint of another model is an error naming the extra tensors", "[checkpoint]") {
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  REQUIRE(run_tiny({"training.steps=2", "checkpoint.dir=" + ck, "model.num_hidden_layers=2"}).exit_code == 0);
  const auto fewer = run_tiny({"training.steps=4", "checkpoint.dir=" + ck, "model.num_hidden_layers=1"});
  INFO(fewer.out << fewer.err);
  CHECK(fewer.exit_code == 2);
  CHECK(fewer.err.find("have no parameter in the recipe's model (first: model.layers.1.") != std::string::npos);
  CHECK(fewer.out.find("resumed") == std::string::npos);
}

TEST_CASE("re-running a finished run says there is nothing to train", "[checkpoint]") {
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  REQUIRE(run_tiny({"training.steps=3", "checkpoint.dir=" + ck, "model.num_hidden_layers=1"}).exit_code == 0);
  const auto again = run_tiny({"training.steps=2", "checkpoint.dir=" + ck, "model.num_hidden_layers=1"});
  INFO(again.out << again.err);
  CHECK(again.exit_code == 0);
  CHECK(again.out.find("nothing to train: checkpoint " + ck + "/step-00000003 is at step 3, which is not before "
                       "training.steps=2") != std::string::npos);
  CHECK(again.out.find("finished after") == std::string::npos);
  CHECK(again.out.find("checkpoint  committed") == std::string::npos);
}

TEST_CASE("resuming with a changed recipe lists what differs", "[checkpoint]") {
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  REQUIRE(run_tiny({"training.steps=2", "checkpoint.dir=" + ck, "model.num_hidden_layers=1"}).exit_code == 0);
  const auto longer = run_tiny({"training.steps=4", "checkpoint.dir=" + ck, "model.num_hidden_layers=1",
                                "optimizer.lr=0.001"});
  INFO(longer.out << longer.err);
  CHECK(longer.exit_code == 0);
  CHECK(longer.out.find("this recipe differs from the checkpoint's in 2 values") != std::string::npos);
  CHECK(longer.out.find("training.steps: 2 -> 4") != std::string::npos);
  CHECK(longer.out.find("optimizer.lr: 0.003 -> 0.001") != std::string::npos);
}

TEST_CASE("interval checkpoints report their commit", "[checkpoint]") {
  TempDir dir;
  const auto r = run_tiny({"training.steps=6", "checkpoint.interval=2", "checkpoint.dir=" + dir.path() + "/ck",
                           "model.num_hidden_layers=1", "logging.interval=1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("checkpoint " + dir.path() + "/ck/step-00000002 committed") != std::string::npos);
  CHECK(r.out.find("checkpoint " + dir.path() + "/ck/step-00000006 committed") != std::string::npos);
}
