// Fuzzing the binary: mutated recipes and overrides through `trainer validate`. The binary must
// exit 0, or 2 with an error message; never crash, never hang.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "process.h"
#include "recipe_mutator.h"

using namespace trainer::test;

TEST_CASE("fuzz: the binary exits 0 or 2 with a message - never crashes or hangs", "[fuzz]") {
  std::vector<nlohmann::json> seeds;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/recipes"))
    if (entry.path().extension() == ".json") seeds.push_back(nlohmann::json::parse(read_file(entry.path().string())));
  // Paths for --set: a sample of real keys plus near misses.
  for (const char* p : {"parallel.tp", "parallel.pp", "parallel.vpp", "parallel.dp", "model.moe", "model.moe.layers",
                        "training.global_batch_size", "training.seq_len", "optimizer.betas", "data.paths",
                        "checkpoint.keep", "model.hf_config", "parallel.tpp", "model"})
    paths.push_back(p);
  TempDir dir;
  int zero = 0, two = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    RecipeMutator mutator(1000 + seed);
    const auto mutated = mutator.mutate(seeds[seed % seeds.size()], paths);
    const std::string file = dir.write("r" + std::to_string(seed) + ".json", mutated.text);
    std::vector<std::string> argv = {trainer_binary(), "validate", file};
    for (const auto& o : mutated.overrides) {
      argv.push_back("--set");
      argv.push_back(o);
    }
    if (seed % 2) {
      argv.push_back("--world-size");
      argv.push_back(std::to_string(seed % 33 + 1));
    }
    const auto r = run_process(argv, 20);
    INFO("seed " << seed << ": " << mutated.description << "\nstderr: " << r.err);
    CHECK(!r.timed_out);
    CHECK(r.signal == 0);
    CHECK((r.exit_code == 0 || r.exit_code == 2));
    if (r.exit_code == 2) {
      CHECK(r.err.find("error") != std::string::npos);
      ++two;
    } else if (r.exit_code == 0) {
      ++zero;
    }
  }
  CHECK(two > 20);
  // Pure garbage files too.
  for (const std::string& garbage : {std::string("\x00\x01\x02", 3), std::string("\xff\xfe{"), std::string(100000, '['),
                                    std::string("{\"model\": ") + std::string(5000, '{')}) {
    const auto r = run_process({trainer_binary(), "validate", dir.write("g.json", garbage)}, 20);
    CHECK(r.exit_code == 2);
    CHECK(r.signal == 0);
  }
}

namespace {
template <typename T>
void append(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
}
}  // namespace

TEST_CASE("fuzz: corrupted Megatron and llm.c headers are exit 2 with a message - never a crash", "[fuzz]") {
  // A valid Megatron index and data (3 sequences of int32 tokens) and a valid llm.c shard.
  std::string idx = std::string("MMIDIDX\0\0", 9), bin, shard;
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, 4);
  append<uint64_t>(idx, 3);
  append<uint64_t>(idx, 4);
  for (int32_t length : {5, 0, 7}) append<int32_t>(idx, length);
  for (int64_t pointer : {0, 20, 20}) append<int64_t>(idx, pointer);
  for (int64_t d : {0, 1, 2, 3}) append<int64_t>(idx, d);
  for (int32_t t = 0; t < 12; ++t) append<int32_t>(bin, t * 7);
  for (int i = 0; i < 256; ++i) append<int32_t>(shard, i == 0 ? 20240520 : i == 1 ? 1 : i == 2 ? 9 : 0);
  for (uint16_t t = 0; t < 9; ++t) append<uint16_t>(shard, uint16_t(t * 11));

  TempDir dir;
  std::mt19937_64 random(7);
  int two = 0;
  for (int round = 0; round < 40; ++round) {
    const bool megatron = round % 2 == 0;
    std::string header = megatron ? idx : shard;
    // Flip a few bytes of the header region, sometimes truncate or extend the file.
    const size_t region = megatron ? header.size() : 12;
    for (int flips = 1 + int(random() % 3); flips > 0; --flips) header[random() % region] = char(random() % 256);
    if (random() % 4 == 0) header.resize(random() % header.size());
    if (random() % 5 == 0) header.append(size_t(1 + random() % 9), '\x01');
    const std::string name = dir.path() + "/f" + std::to_string(round);
    if (megatron) {
      dir.write("f" + std::to_string(round) + ".idx", header);
      dir.write("f" + std::to_string(round) + ".bin", bin);
    } else {
      dir.write("f" + std::to_string(round) + ".bin", header);
    }
    const auto r = run_process({trainer_binary(), "data", "inspect", megatron ? name : name + ".bin", "--format",
                                megatron ? "megatron" : "llmc", "--vocab-size", "256"},
                               20);
    INFO("round " << round << ": " << r.err);
    CHECK(!r.timed_out);
    CHECK(r.signal == 0);
    CHECK((r.exit_code == 0 || r.exit_code == 2));
    if (r.exit_code == 2) {
      CHECK(r.err.rfind("error: " + name, 0) == 0);
      ++two;
    }
  }
  CHECK(two > 20);  // most mutations are caught
}
