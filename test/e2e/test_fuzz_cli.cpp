// Fuzzing the binary: mutated recipes and overrides through `trainer validate`. The binary must
// exit 0, or 2 with an error message; never crash, never hang.
#include <catch2/catch.hpp>
#include <filesystem>

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
