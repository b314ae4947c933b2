// Runs that heal themselves (issue 38): the local launcher's restarts after killed, failed and
// hung workers (bit-identical losses after every restore point), a restart on fewer workers at the
// same global batch, no restart where it would only repeat (bad input, a diverged run), and the
// same loop around mpirun (scripts/restart_job).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "jsonl.h"
#include "process.h"
#include "script.h"

using namespace trainer::test;

namespace {

const std::string kTiny = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-llama.json";

// A small run: 24 steps of a 2-layer model, every step logged.
std::string small_job(const std::string& metrics) {
  return trainer_binary() + " run " + kTiny +
         " --set model.num_hidden_layers=2 --set training.seq_len=64 --set training.steps=24"
         " --set optimizer.warmup_steps=2 --set logging.interval=1 --set logging.metrics_file=" + metrics;
}

// The same with `nproc` workers of trainer's own launcher.
std::string small_run(int nproc, const std::string& metrics) {
  return small_job(metrics) + " --nproc-per-node " + std::to_string(nproc);
}

// Step records and restart records of a metrics file.
struct Records {
  std::map<int64_t, std::vector<nlohmann::json>> steps;  // every record of each step (a restart repeats some)
  std::vector<nlohmann::json> restarts;
};

Records read_records(const std::string& path) {
  Records r;
  for (const auto& line : read_jsonl(path)) {
    if (line.value("event", "") == "restart")
      r.restarts.push_back(line);
    else
      r.steps[line.at("step").get<int64_t>()].push_back(line);
  }
  return r;
}

// Waits (in the script) until the metrics file $M holds at least $1 step records.
const std::string kWaitForSteps =
    "steps() { n=$(grep -c '\"loss\"' \"$M\" 2>/dev/null); echo \"${n:-0}\"; }\n"
    "wait_steps() { for i in $(seq 1200); do [ \"$(steps)\" -ge \"$1\" ] && return 0; sleep 0.05; done; return 1; }\n"
    "worker() { pgrep -f \"trainer worker rank $1 .*$M\" | head -n 1; }\n"
    // The step of the newest record (0 before the first, or when the newest is a restart record).
    "newest() { s=$(tail -n 1 \"$M\" 2>/dev/null | sed -n 's/.*\"step\":\\([0-9]*\\).*/\\1/p'); echo \"${s:-0}\"; }\n"
    "wait_newest() { for i in $(seq 3000); do [ \"$(newest)\" -ge \"$1\" ] && return 0; sleep 0.02; done; return 1; }\n";

}  // namespace

TEST_CASE("dist: a 4-worker run with --max-restarts 3 survives three SIGKILLs at seeded moments with losses bit-identical to an uninterrupted run - then continues on 2 workers at the same global batch",
          "[dist][restart]") {
  TempDir dir;
  const std::string reference = dir.path() + "/reference.jsonl";
  const auto cold = bash(small_run(4, reference));
  INFO(cold.out << cold.err);
  REQUIRE(cold.exit_code == 0);
  const Records want = read_records(reference);
  REQUIRE(want.steps.size() == 24);

  // Three kills of a random worker (seeded): the k-th once the run's newest step reaches a target
  // 5 to 7 steps past the previous one (the first at step 3 to 5), then 0 to 90 ms later: any phase
  // of a step or of a checkpoint being written. Targets are steps, not records or seconds, so all
  // three kills land before step 24 however fast or slow the machine is (the last by step 19 plus
  // the delay; a schedule counted in records let the run finish first on a faster machine).
  const std::string chaos = dir.path() + "/chaos.jsonl";
  const auto r = bash("M=" + chaos + "\n" + kWaitForSteps + "RANDOM=38\n" + small_run(4, chaos) +
                          " --max-restarts 3 --set checkpoint.dir=" + dir.path() +
                          "/ck --set checkpoint.interval=4 > " + dir.path() + "/out.txt 2> " + dir.path() +
                          "/err.txt & L=$!\n"
                          "start=$(date +%s.%N); wait_steps 1; echo \"cold_start=$(echo \"$(date +%s.%N) - $start\" | bc)\"\n"
                          "target=0\n"
                          "for k in 1 2 3; do\n"
                          "  if [ $k = 1 ]; then target=$(( 3 + RANDOM % 3 )); else target=$(( target + 5 + RANDOM % 3 )); fi\n"
                          "  wait_newest $target || { echo \"step $target never came\"; break; }\n"
                          "  sleep 0.0$(( RANDOM % 10 )); rank=$(( RANDOM % 4 )); pid=$(worker $rank)\n"
                          "  [ -n \"$pid\" ] || { echo \"no worker rank $rank\"; continue; }\n"
                          "  seen=$(steps); kill -KILL $pid; killed=$(date +%s.%N)\n"
                          "  wait_steps $(( seen + 1 )) && echo \"recovery=$(echo \"$(date +%s.%N) - $killed\" | bc)\"\n"
                          "  echo \"killed rank $rank after $seen step records\"\n"
                          "done\n"
                          "wait $L; echo rc=$?\n",
                      600);
  const std::string err = read_file(dir.path() + "/err.txt"), out = read_file(dir.path() + "/out.txt");
  INFO(r.out << out << err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("rc=0") != std::string::npos);
  CHECK(err.find("trainer: restart 3 of 3 after worker rank") != std::string::npos);
  CHECK(err.find("trainer: finished after 3 restarts") != std::string::npos);
  const Records got = read_records(chaos);
  REQUIRE(got.restarts.size() == 3);
  for (size_t i = 0; i < got.restarts.size(); ++i) {
    CHECK(got.restarts[i].at("restart") == int64_t(i + 1));
    CHECK(got.restarts[i].at("cause").get<std::string>().find("was killed by signal 9") != std::string::npos);
  }
  // Every step's loss, before and after every restore point, is the uninterrupted run's, bit for bit.
  REQUIRE(got.steps.size() == 24);
  size_t repeated = 0;
  for (const auto& [step, records] : got.steps) {
    repeated += records.size() - 1;
    for (const auto& record : records) {
      INFO("step " << step);
      CHECK(record.at("loss").get<double>() == want.steps.at(step).front().at("loss").get<double>());
    }
  }
  std::printf("chaos: %zu step records repeated after restores; %s", repeated, r.out.c_str());
  // The goal: from a kill to the next completed step, against the cold start.
  const auto cold_at = r.out.find("cold_start=");
  REQUIRE(cold_at != std::string::npos);
  const double cold_start = std::stod(r.out.substr(cold_at + 11));
  for (auto at = r.out.find("recovery="); at != std::string::npos; at = r.out.find("recovery=", at + 1))
    CHECK(std::stod(r.out.substr(at + 9)) < 2 * cold_start + 1);  // the goal: at most 2x, 1 s for this busy machine

  // Killed for good at 4 workers (no restarts left), the job comes back with 2: parallel.dp -1
  // follows, gradient accumulation doubles, and the losses continue the 4-worker curve (fp32
  // tolerance: another summation order).
  const std::string killed = dir.path() + "/killed.jsonl";
  const auto k = bash("M=" + killed + "\n" + kWaitForSteps + small_run(4, killed) + " --set checkpoint.dir=" +
                      dir.path() + "/ck2 --set checkpoint.interval=4 & L=$!\n"
                      "wait_steps 14; kill -KILL $(worker 3); wait $L; echo rc=$?\n");
  INFO(k.out << k.err);
  REQUIRE(k.exit_code == 0);
  CHECK(k.out.find("rc=0") == std::string::npos);
  const std::string shrunk = dir.path() + "/shrunk.jsonl";
  const auto s = bash(small_run(2, shrunk) + " --max-restarts 1 --set checkpoint.dir=" + dir.path() +
                      "/ck2 --set checkpoint.resume=auto");
  INFO(s.out << s.err);
  REQUIRE(s.exit_code == 0);
  CHECK(s.out.find("resumed from " + dir.path() + "/ck2/step-000000") != std::string::npos);
  CHECK(s.out.find("global batch 16 x 64 tokens (2 micro-batches of 4 per rank)") != std::string::npos);
  const Records continued = read_records(shrunk);
  REQUIRE(continued.steps.size() >= 4);
  REQUIRE(continued.steps.rbegin()->first == 24);
  double worst = 0;
  for (const auto& [step, records] : continued.steps) {
    const double a = records.front().at("loss"), b = want.steps.at(step).front().at("loss");
    worst = std::max(worst, std::fabs(a - b) / std::fabs(b));
  }
  std::printf("shrink 4 -> 2 workers from step %lld: largest relative loss difference %.3g\n",
              (long long)continued.steps.begin()->first - 1, worst);
  CHECK(worst < 1e-5);
  // A world the fixed dimensions do not divide is refused with the reason, before any worker starts.
  const auto odd = bash(small_run(3, dir.path() + "/odd.jsonl") + " --max-restarts 1 --set parallel.tp=2");
  INFO(odd.out << odd.err);
  CHECK(odd.exit_code == 2);
  CHECK(odd.err.find("parallel.tp") != std::string::npos);
}

TEST_CASE("dist: a hang past the collective timeout restarts the job naming the frozen rank - exhausted restarts exit 1 naming the last cause",
          "[dist][restart]") {
  TempDir dir;
  const std::string metrics = dir.path() + "/hang.jsonl";
  const auto r = bash("M=" + metrics + "\n" + kWaitForSteps + small_run(3, metrics) +
                          " --set training.global_batch_size=12 --set training.steps=1000000"
                          " --set parallel.collective_timeout_s=4 --max-restarts 1 --set checkpoint.dir=" +
                          dir.path() + "/ck --set checkpoint.interval=2 > " + dir.path() + "/out.txt 2> " +
                          dir.path() + "/err.txt & L=$!\n"
                          "wait_steps 3; kill -STOP $(worker 1)\n"
                          "for i in $(seq 600); do grep -q '\"event\"' \"$M\" && break; sleep 0.05; done\n"
                          "seen=$(steps); wait_steps $(( seen + 2 )); kill -KILL $(worker 2)\n"
                          "wait $L; echo rc=$?; sleep 0.5; pgrep -f \"trainer worker.*$M\" && echo LEFT_BEHIND; exit 0\n",
                      300);
  const std::string err = read_file(dir.path() + "/err.txt");
  INFO(r.out << read_file(dir.path() + "/out.txt") << err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("rc=1\n") != std::string::npos);
  CHECK(r.out.find("LEFT_BEHIND") == std::string::npos);
  // The hang: the flight recorder's diagnosis is the restart's cause.
  CHECK(err.find("trainer: restart 1 of 1 after worker rank") != std::string::npos);
  // The frozen rank stops wherever SIGSTOP finds it: in the gradient all-reduce or in the straggler
  // watch's all-gather of the logged step (both every step here).
  CHECK((err.find("hang: all_reduce #") != std::string::npos || err.find("hang: all_gather #") != std::string::npos));
  CHECK(err.find("rank 1 never entered it") != std::string::npos);
  CHECK(err.find("trainer: giving up after 1 restart; last cause: worker rank 2 was killed by signal 9") !=
        std::string::npos);
  const Records got = read_records(metrics);
  REQUIRE(got.restarts.size() == 1);
  const std::string cause = got.restarts[0].at("cause");
  CHECK(cause.find("hang") != std::string::npos);
  CHECK(cause.find("rank 1 never entered it") != std::string::npos);
  CHECK_FALSE(got.restarts[0].at("resume_from").is_null());
}

TEST_CASE("dist: a diverged run and bad input do not restart - scripts/restart_job restarts an mpirun job after a killed rank",
          "[dist][restart]") {
  TempDir dir;
  // Diverged: exit 3 once, no restart.
  const auto nan = bash(small_run(2, dir.path() + "/nan.jsonl") +
                        " --max-restarts 2 --set optimizer.lr=1e6 --set optimizer.warmup_steps=0"
                        " --set training.grad_clip=0");
  INFO(nan.out << nan.err);
  CHECK(nan.exit_code == 3);
  CHECK(nan.err.find("not restarting: a diverged run (exit 3) would only repeat") != std::string::npos);
  CHECK(nan.err.find("trainer: restart") == std::string::npos);
  // Bad input found by the workers (a missing data file): exit 2 once, no restart.
  const auto bad = bash(small_run(2, dir.path() + "/bad.jsonl") +
                        " --max-restarts 2 --set data.source=tokens --set data.paths=[\\\"/nonexistent/corpus\\\"]");
  INFO(bad.out << bad.err);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("not restarting: bad input (exit 2) would only repeat") != std::string::npos);
  CHECK(bad.err.find("/nonexistent/corpus") != std::string::npos);
  // --max-restarts under a launcher that is not trainer's is refused: the job restarts from outside.
  const auto under = bash("RANK=0 WORLD_SIZE=1 " + small_run(1, dir.path() + "/under.jsonl") + " --max-restarts 2");
  CHECK(under.exit_code == 2);
  CHECK(under.err.find("scripts/restart_job") != std::string::npos);

  // mpirun: a rank killed after a checkpoint; the wrapper starts the job again, which resumes.
  const std::string metrics = dir.path() + "/mpi.jsonl";
  const auto r = bash("M=" + metrics + "\n" + kWaitForSteps + std::string(TRAINER_SOURCE_DIR) +
                          "/scripts/restart_job --max-restarts 2 mpirun --allow-run-as-root --oversubscribe -np 2"
                          " -x OMP_NUM_THREADS=1 " +
                          small_job(metrics) +
                          " --set checkpoint.dir=" + dir.path() + "/ck --set checkpoint.interval=4 > " + dir.path() +
                          "/out.txt 2> " + dir.path() + "/err.txt & L=$!\n"
                          "wait_steps 6\n"
                          "pid=$(pgrep -f \"^" + trainer_binary() + " run .*$M\" | tail -n 1); kill -KILL $pid\n"
                          "wait $L; echo rc=$?\n",
                      300);
  const std::string err = read_file(dir.path() + "/err.txt"), out = read_file(dir.path() + "/out.txt");
  INFO(r.out << out << err);
  CHECK(r.out.find("rc=0") != std::string::npos);
  CHECK(err.find("restart_job: restart 1 of 2 after") != std::string::npos);
  CHECK(out.find("restart 1: resuming from " + dir.path() + "/ck/step-0000000") != std::string::npos);
  const Records got = read_records(metrics);
  CHECK(got.restarts.size() == 1);
  CHECK(got.steps.size() == 24);
}
