// The data users already have: the same documents in trainer's format (scripts/prepare_data),
// Megatron-LM's indexed dataset (written by megatron-core's own IndexedDatasetBuilder) and llm.c
// shards (its documented header) give bit-identical loss curves; `trainer data inspect` describes
// each. The test installs megatron-core from PyPI into the Python environment that holds torch
// (third_party/pins.sh, MEGATRON_TEST_PACKAGES), as the Hugging Face test installs transformers.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "jsonl.h"
#include "pip_install.h"
#include "process.h"

using namespace trainer::test;

namespace {

void install_megatron_core() {
  pip_install("numpy \"${TORCH_PYTHON_DEPS[@]}\"");
  pip_install("--no-deps \"${MEGATRON_TEST_PACKAGES[@]}\"");
}

std::vector<double> losses_on(const std::string& path, const std::string& metrics) {
  const auto r = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set",
                              "data.source=tokens", "--set", "data.paths=[\"" + path + "\"]", "--set",
                              "training.steps=6", "--set", "optimizer.warmup_steps=2", "--set",
                              "model.num_hidden_layers=1", "--set", "training.seq_len=32", "--set",
                              "logging.interval=1", "--set", "logging.metrics_file=" + metrics},
                             120, {"OMP_NUM_THREADS=1"});
  INFO(path << ": " << r.out << r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<double> out;
  for (const auto& m : read_jsonl(metrics)) out.push_back(m["loss"].get<double>());
  return out;
}

}  // namespace

TEST_CASE("data: trainer - Megatron-LM and llm.c files of the same tokens train identically", "[data][e2e]") {
  install_megatron_core();
  TempDir dir;
  std::vector<std::string> texts;
  for (int d = 0; d < 6; ++d) {
    std::string text;
    for (int line = 0; line < 40 + 17 * d; ++line) text += "document " + std::to_string(d) + " line " + std::to_string(line) + ": the quick brown fox\n";
    texts.push_back(dir.write("doc" + std::to_string(d) + ".txt", text));
  }
  std::vector<std::string> prepare = {source_dir() + "/scripts/prepare_data", "--out", dir.path() + "/ours"};
  prepare.insert(prepare.end(), texts.begin(), texts.end());
  const auto prepared = run_process(prepare, 120);
  INFO(prepared.out << prepared.err);
  REQUIRE(prepared.exit_code == 0);
  const auto written = run_process({TRAINER_PYTHON, source_dir() + "/test/e2e/data_formats.py", dir.path() + "/ours",
                                    dir.path()},
                                   300);
  INFO(written.out << written.err);
  REQUIRE(written.exit_code == 0);

  const std::vector<std::string> paths = {dir.path() + "/ours", dir.path() + "/megatron", dir.path() + "/shard_*.bin"};
  const auto inspected = run_process({trainer_binary(), "data", "inspect", paths[0], paths[1], paths[2], "--seq-len",
                                      "32", "--vocab-size", "256", "--json"});
  INFO(inspected.out << inspected.err);
  REQUIRE(inspected.exit_code == 0);
  const auto doc = nlohmann::json::parse(inspected.out);
  REQUIRE(doc.size() == 3);
  CHECK(doc[0]["format"] == "trainer");
  CHECK(doc[1]["format"] == "megatron");
  CHECK(doc[2]["format"] == "llmc");
  for (const auto& item : doc) {
    CHECK(item["tokens"] == doc[0]["tokens"]);
    CHECK(item["max_token_id"] == doc[0]["max_token_id"]);
    CHECK(item["samples"]["count"] == doc[0]["samples"]["count"]);
  }
  CHECK(doc[0]["documents"] == 6);
  CHECK(doc[1]["documents"] == 6);
  CHECK(doc[2]["documents"].is_null());
  WARN(run_process({trainer_binary(), "data", "inspect", paths[0], paths[1], paths[2], "--seq-len", "32"}).out);

  const auto ours = losses_on(paths[0], dir.path() + "/ours.jsonl");
  const auto megatron = losses_on(paths[1], dir.path() + "/megatron.jsonl");
  const auto llmc = losses_on(paths[2], dir.path() + "/llmc.jsonl");
  REQUIRE(ours.size() == 6);
  CHECK(megatron == ours);  // bit-identical
  CHECK(llmc == ours);
}
