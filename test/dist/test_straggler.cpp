// Straggler attribution across real worker processes (issue 38; lib/train/straggler_watch.h): a
// worker stopped and continued by the test (SIGSTOP/SIGCONT, 30% of its time) is named by rank 0
// within 10 logged steps; clean runs name nobody; and the ranks' step times could not have told
// (the collectives make them equal), only their own times can. scripts/bench_straggler runs the
// same 10 + 10 times and prints the rates.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "jsonl.h"
#include "process.h"
#include "script.h"

using namespace trainer::test;

namespace {

// Two data-parallel workers on the CPU, about 0.1 s a step on an idle core, a logged step every 8
// steps (about eight stop-and-continue periods; a rank is named after 3 slow logged steps in a row,
// the defaults). Intervals this long average out the few-second swings of a shared virtual CPU's
// speed, which reach 20% and more over a few intervals of 4 steps.
std::string job(const std::string& metrics) {
  return "OMP_NUM_THREADS=1 " + trainer_binary() + " run " + source_dir() +
         "/recipes/tiny-llama.json --nproc-per-node 2 --cpu --set training.global_batch_size=16"
         " --set training.steps=72 --set logging.interval=8 --set optimizer.warmup_steps=1"
         " --set logging.metrics_file=" + metrics;
}

struct Run {
  std::vector<nlohmann::json> records;
  size_t started_at = 0;  // records written before the stopping began
  std::string out;
};

// One run; `stopped`: the rank stopped for 30 ms of every 100 ms from the first logged step on
// (the run's first interval, not judged, is over), -1 for a clean run.
Run run(int stopped) {
  TempDir dir;
  const std::string metrics = dir.path() + "/straggler.jsonl";
  std::string script = job(metrics) + " > " + dir.path() + "/out.txt 2>&1 & L=$!\n";
  if (stopped >= 0)
    script += "for i in $(seq 600); do [ -s " + metrics + " ] && [ $(wc -l < " + metrics +
              ") -ge 1 ] && break; sleep 0.02; done\n"
              "pid=$(pgrep -f 'trainer worker rank " + std::to_string(stopped) + " .*" + metrics + "' | head -1)\n"
              "echo started_at=$(wc -l < " + metrics + ")\n"
              // Every stop is followed by a continue, so the worker is never left stopped.
              "while kill -0 $pid 2>/dev/null; do kill -STOP $pid; sleep 0.03; kill -CONT $pid; sleep 0.07; done\n";
  script += "wait $L; echo rc=$?\n";
  const ProcessResult r = bash(script, 120);
  Run result;
  result.out = r.out + read_file(dir.path() + "/out.txt");
  INFO(result.out);
  REQUIRE(r.out.find("rc=0") != std::string::npos);
  result.records = read_jsonl(metrics);
  const auto at = r.out.find("started_at=");
  if (stopped >= 0) REQUIRE(at != std::string::npos);
  if (at != std::string::npos) result.started_at = size_t(std::stoul(r.out.substr(at + 11)));
  return result;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

TEST_CASE("dist: straggler - a worker stopped 30% of its time is named within 10 logged steps - clean runs name nobody - step times could not tell", "[.][dist_straggler]") {
  // Three runs each way here (the suite's time); scripts/bench_straggler runs ten each way.
  for (const int stopped : {1, 0, 1}) {
    const Run r = run(stopped);
    INFO("rank " << stopped << " stopped\n" << r.out);
    REQUIRE(r.records.size() == 9);
    std::vector<double> step_spread, own_ratio;
    int64_t named_at = -1;
    for (size_t i = r.started_at; i < r.records.size(); ++i) {
      const auto& m = r.records[i];
      REQUIRE(m.contains("own_time_max_ratio"));
      REQUIRE(m.contains("step_time_max_ratio"));
      step_spread.push_back(m["step_time_max_ratio"].get<double>());
      own_ratio.push_back(m["own_time_max_ratio"].get<double>());
      if (named_at < 0 && m.contains("straggler_rank") && m["straggler_rank"] == stopped)
        named_at = int64_t(i - r.started_at);
    }
    for (const auto& m : r.records)
      if (m.contains("straggler_rank")) CHECK(m["straggler_rank"] == stopped);  // never the other rank
    CHECK(named_at >= 0);
    CHECK(named_at < 10);
    CHECK(r.out.find("straggler: rank " + std::to_string(stopped) + " (host ") != std::string::npos);
    // The step times of the two ranks stay within a few percent of each other while the stopped
    // rank's own time is well above the other's: step times alone could not have named it.
    CHECK(median(step_spread) < 1.05);
    CHECK(median(own_ratio) > 1.2);
    WARN("rank " << stopped << " stopped: named " << named_at << " logged steps after the stopping began; median "
                 << "step-time spread " << median(step_spread) << ", median own-time ratio " << median(own_ratio));
  }
  for (int clean = 0; clean < 3; ++clean) {
    const Run r = run(-1);
    INFO("clean run " << clean << "\n" << r.out);
    REQUIRE(r.records.size() == 9);
    double worst = 0;
    for (const auto& m : r.records) {
      REQUIRE(m.contains("own_time_max_ratio"));
      CHECK_FALSE(m.contains("straggler_rank"));
      worst = std::max(worst, m["own_time_max_ratio"].get<double>());
    }
    CHECK(r.out.find("straggler:") == std::string::npos);
    WARN("clean run " << clean << ": largest own-time ratio " << worst);
  }
}
