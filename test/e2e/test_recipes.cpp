// Every recipe in recipes/ validates at the world size recipes/README.md gives for it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "process.h"

using namespace trainer::test;

namespace {
// file -> intended world size, from the table in recipes/README.md.
std::map<std::string, std::string> intended_world_sizes() {
  std::map<std::string, std::string> sizes;
  std::istringstream lines(read_file(source_dir() + "/recipes/README.md"));
  const std::regex row(R"(^\|\s*([\w.\-]+\.json)\s*\|[^|]*\|[^|]*\|\s*(\d+)\s*\|)");
  std::string line;
  std::smatch m;
  while (std::getline(lines, line))
    if (std::regex_search(line, m, row)) sizes[m[1]] = m[2];
  return sizes;
}
}  // namespace

TEST_CASE("every recipe in recipes/ validates at its intended world size", "[recipes]") {
  const auto sizes = intended_world_sizes();
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/recipes")) {
    if (entry.path().extension() != ".json") continue;
    const std::string file = entry.path().filename().string();
    INFO(file);
    REQUIRE(sizes.count(file) == 1);  // every recipe is listed
    const auto r = run_process({trainer_binary(), "validate", entry.path().string(), "--world-size", sizes.at(file)}, 60);
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("mesh for world size " + sizes.at(file)) != std::string::npos);
    ++checked;
  }
  CHECK(checked >= 8);
  for (const char* required : {"tiny-llama.json", "tiny-moe.json", "llama3-8b.json", "llama3-70b.json",
                               "llama3.1-405b.json", "mixtral-8x7b.json", "mixtral-8x22b.json", "deepseek-v3.json",
                               "qwen3-8b.json", "qwen3-30b-a3b.json"})
    CHECK(sizes.count(required) == 1);
}

TEST_CASE("the tiny recipes also validate with data parallelism", "[recipes]") {
  for (const char* recipe : {"tiny-llama.json", "tiny-moe.json"})
    for (const char* world : {"1", "2", "4"}) {
      const auto r = run_process({trainer_binary(), "validate", source_dir() + "/recipes/" + recipe, "--world-size", world});
      INFO(recipe << " at " << world << ": " << r.err);
      CHECK(r.exit_code == 0);
    }
}

TEST_CASE("every real-model recipe fits an 80 GB H100 at its intended world size (by the estimator)", "[recipes]") {
  const auto sizes = intended_world_sizes();
  int checked = 0;
  for (const auto& [file, world] : sizes) {
    if (file.rfind("tiny-", 0) == 0) continue;  // CPU recipes
    const auto r = run_process({trainer_binary(), "estimate", source_dir() + "/recipes/" + file, "--world-size", world,
                                "--gpu", "h100-sxm", "--json"},
                               60);
    INFO(file << " at " << world << ": " << r.err);
    REQUIRE(r.exit_code == 0);
    const auto memory = nlohmann::json::parse(r.out).at("memory");
    INFO("device total " << memory.at("device_total_bytes").get<double>() / (1 << 30) << " GiB");
    CHECK(memory.at("fits").get<bool>());
    ++checked;
  }
  CHECK(checked >= 6);
}
