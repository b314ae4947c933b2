// Observability outputs read back by their reference readers: TensorBoard event files through
// TensorBoard's own EventAccumulator (installed by the test from PyPI, third_party/pins.sh
// TENSORBOARD_PIP_PACKAGES, into the Python environment that holds torch), and the step-time
// breakdown in the metrics file.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "jsonl.h"
#include "pip_install.h"
#include "process.h"

using namespace trainer::test;

namespace {

void install_tensorboard() {
  static bool done = false;
  if (done) return;
  pip_install("\"${TENSORBOARD_PIP_PACKAGES[@]}\"");
  done = true;
}

// {tag: [[step, value], ...]} as TensorBoard's EventAccumulator reads the directory.
nlohmann::json read_with_tensorboard(const std::string& dir) {
  TempDir scratch;
  const std::string script = scratch.write("read.py", R"PY(
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
)PY");
  const auto r = run_process({TRAINER_PYTHON, script, dir}, 300);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("tensorboard: event files read back by TensorBoard's reader equal the metrics file", "[observability]") {
  install_tensorboard();
  TempDir dir;
  const std::string tb = dir.path() + "/tb", metrics = dir.path() + "/m.jsonl";
  const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-moe.json", "--set",
                                "training.steps=6", "--set", "logging.interval=2", "--set", "optimizer.warmup_steps=1",
                                "--set", "logging.metrics_file=" + metrics, "--set", "logging.tensorboard_dir=" + tb,
                                "--set", "evaluation.interval=3"},
                               300, {"OMP_NUM_THREADS=1"});
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const nlohmann::json scalars = read_with_tensorboard(tb);
  INFO(scalars.dump());
  std::vector<nlohmann::json> steps, evals;
  for (const auto& line : read_jsonl(metrics)) (line.contains("eval_loss") ? evals : steps).push_back(line);
  REQUIRE(steps.size() == 3);  // steps 2, 4, 6
  // The same values at the same steps (TensorBoard stores float32).
  const std::map<std::string, std::string> same = {{"train/loss", "loss"}, {"train/lr", "lr"},
                                                   {"train/grad_norm", "grad_norm"},
                                                   {"perf/tokens_per_s", "tokens_per_s"},
                                                   {"memory/peak_bytes", "mem_peak_bytes"}, {"time/step_s", "time_s"},
                                                   {"moe/aux_loss", "aux_loss"}};
  for (const auto& [tag, key] : same) {
    INFO(tag);
    REQUIRE(scalars.contains(tag));
    REQUIRE(scalars[tag].size() == steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      CHECK(scalars[tag][i][0].get<int64_t>() == steps[i]["step"].get<int64_t>());
      const double want = steps[i][key].get<double>(), got = scalars[tag][i][1].get<double>();
      CHECK(std::fabs(got - want) <= 1e-6 * std::fabs(want) + 1e-30);
    }
  }
  // The step-time breakdown and the MoE load per layer are there too; evaluation at steps 3 and 6.
  for (const char* tag : {"time/forward_s", "time/backward_s", "time/comm_wait_s", "time/optimizer_s",
                          "time/data_s", "time/checkpoint_s", "time/other_s", "moe/layer_1/max_over_mean"})
    CHECK(scalars.contains(tag));
  REQUIRE(scalars.contains("eval/loss"));
  REQUIRE(evals.size() == 2);
  CHECK(scalars["eval/loss"][1][0].get<int64_t>() == 6);
  CHECK(std::fabs(scalars["eval/loss"][1][1].get<double>() - evals[1]["eval_loss"].get<double>()) < 1e-5);
}

TEST_CASE("tensorboard: a directory that cannot be created is a recipe error naming it", "[observability]") {
  TempDir dir;
  const std::string blocker = dir.write("file", "not a directory");
  const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set",
                                "training.steps=1", "--set", "logging.tensorboard_dir=" + blocker + "/tb"},
                               120, {"OMP_NUM_THREADS=1"});
  CHECK(run.exit_code == 2);
  CHECK(run.err.find("logging.tensorboard_dir") != std::string::npos);
  CHECK(run.err.find(blocker + "/tb") != std::string::npos);
}

TEST_CASE("metrics: the step-time breakdown adds up to at most the step time at DP=2", "[observability]") {
  TempDir dir;
  const std::string metrics = dir.path() + "/m.jsonl";
  const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json",
                                "--nproc-per-node", "2", "--set", "training.steps=4", "--set", "logging.interval=1",
                                "--set", "logging.metrics_file=" + metrics, "--set", "parallel.zero=1",
                                "--set", "checkpoint.dir=" + dir.path() + "/ck", "--set", "checkpoint.interval=2"},
                               300, {"OMP_NUM_THREADS=1"});
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const auto lines = read_jsonl(metrics);
  REQUIRE(lines.size() == 4);
  for (const auto& m : lines) {
    const auto& t = m["time_breakdown"];
    double sum = 0;
    for (const char* phase : {"data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "checkpoint_s"}) {
      INFO(phase << " in " << t.dump());
      REQUIRE(t.contains(phase));
      CHECK(t[phase].get<double>() >= 0);
      sum += t[phase].get<double>();
    }
    CHECK(t["forward_s"].get<double>() > 0);
    CHECK(t["backward_s"].get<double>() > 0);
    // The phases partition (part of) the step: with the rest they give its wall time.
    CHECK(sum <= m["time_s"].get<double>() * 1.01 + 1e-3);
    CHECK(std::fabs(sum + t["other_s"].get<double>() - m["time_s"].get<double>()) <= 0.01 * m["time_s"].get<double>() + 1e-3);
  }
  // Two data-parallel ranks reduce gradients: some step waited on a collective; the checkpoint of
  // step 2 stalls step 3.
  double waited = 0;
  for (const auto& m : lines) waited += m["time_breakdown"]["comm_wait_s"].get<double>();
  CHECK(waited > 0);
  CHECK(lines[2]["time_breakdown"]["checkpoint_s"].get<double>() > 0);
}

TEST_CASE("metrics: collective waits by group name show the MoE token dispatch (ep) apart at ep 2", "[observability]") {
  TempDir dir;
  const std::string metrics = dir.path() + "/m.jsonl";
  const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-moe.json", "--nproc-per-node",
                                "2", "--set", "parallel.ep=2", "--set", "training.steps=3", "--set", "logging.interval=1",
                                "--set", "logging.metrics_file=" + metrics},
                               300, {"OMP_NUM_THREADS=1"});
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  const auto lines = read_jsonl(metrics);
  REQUIRE(lines.size() == 3);
  double dispatch = 0;
  for (const auto& m : lines) {
    INFO(m.dump());
    REQUIRE(m.contains("comm_wait_by_group_s"));
    double sum = 0;
    for (const auto& [group, seconds] : m["comm_wait_by_group_s"].items()) {
      CHECK(seconds.get<double>() >= 0);
      sum += seconds.get<double>();
    }
    // A split of every wait between two logged steps: at least the phases' waits, at most the step.
    CHECK(sum >= m["time_breakdown"]["comm_wait_s"].get<double>() * 0.999 - 1e-6);
    CHECK(sum <= m["time_s"].get<double>() * 1.05 + 1e-3);
    if (m["comm_wait_by_group_s"].contains("ep")) dispatch += m["comm_wait_by_group_s"]["ep"].get<double>();
  }
  CHECK(dispatch > 0);  // the all-to-alls of the expert dispatch on the ep group
}

TEST_CASE("profiling: a step range gives one Chrome trace per rank with ATen ops - our scopes and collectives", "[observability]") {
  TempDir dir;
  const std::string traces = dir.path() + "/traces";
  const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json",
                                "--nproc-per-node", "2", "--set", "training.steps=4", "--set",
                                "profiling.steps=[2,3]", "--set", "profiling.dir=" + traces},
                               300, {"OMP_NUM_THREADS=1"});
  INFO(run.out << run.err);
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("profile of steps 2-3") != std::string::npos);
  for (const char* file : {"/trace-rank-00000.json", "/trace-rank-00001.json"}) {
    INFO(file);
    REQUIRE(std::filesystem::exists(traces + file));
    const nlohmann::json trace = nlohmann::json::parse(read_file(traces + file));
    REQUIRE(trace.contains("traceEvents"));
    std::set<std::string> names;
    for (const auto& e : trace["traceEvents"])
      if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
    auto any = [&](const std::string& prefix) {
      for (const auto& n : names)
        if (n.rfind(prefix, 0) == 0) return true;
      return false;
    };
    CHECK(any("aten::mm"));
    CHECK(any("forward chunk 0 micro-batch 0"));
    CHECK(any("backward chunk 0"));
    CHECK(any("all_reduce"));  // the gradient buckets over dp
    CHECK(any("wait all_reduce"));
    CHECK(any("optimizer step"));
    // Only the range was recorded.
    CHECK(names.count("step 2") == 1);
    CHECK(names.count("step 3") == 1);
    CHECK(names.count("step 1") == 0);
    CHECK(names.count("step 4") == 0);
  }
}

TEST_CASE("profiling: a bad step range is a recipe error naming the field", "[observability]") {
  for (const auto& [steps, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"[3,2]", "must be [first, last] with first <= last"}, {"[2,9]", "ends after the last step"}}) {
    const auto run = run_process({trainer_binary(), "run", source_dir() + "/recipes/tiny-llama.json", "--set",
                                  "training.steps=4", "--set", "profiling.steps=" + steps, "--set", "profiling.dir=x"});
    INFO(steps << "\n" << run.err);
    CHECK(run.exit_code == 2);
    CHECK(run.err.find("profiling.steps=") != std::string::npos);
    CHECK(run.err.find(fragment) != std::string::npos);
  }
}
