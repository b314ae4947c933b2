// One job per checkpoint directory (checkpoint/dir_claim.h) through the binary: a second job is
// refused while the first trains unharmed; a SIGKILLed job's claim is taken over and the run
// resumes bit-exactly; another host's stale claim is taken over, a fresh one refused unless
// --force; a multi-rank job claims once; ckpt inspect shows the claim.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "jsonl.h"
#include "process.h"

using namespace trainer::test;

namespace {
const std::string kTiny = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-llama.json";

// A fast tiny run whose learning rate does not depend on training.steps after warm-up, so a run
// resumed with fewer steps follows the uninterrupted run exactly.
std::string tiny_command(const std::string& sets) {
  return trainer_binary() + " run " + kTiny +
         " --set model.num_hidden_layers=1 --set training.seq_len=32 --set optimizer.warmup_steps=2"
         " --set optimizer.decay=constant --set logging.interval=1 " + sets;
}

ProcessResult bash(const std::string& script, double timeout = 180) {
  return run_process({"/bin/bash", "-c", script}, timeout, {"OMP_NUM_THREADS=1"});
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  for (const auto& m : read_jsonl(metrics)) out.push_back(m["loss"].get<double>());
  return out;
}

void write_claim(const std::string& dir, const std::string& host, double heartbeat_age_s) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/.claim.json") << nlohmann::json{{"host", host},
                                                        {"pid", 4567},
                                                        {"process_start", "1"},
                                                        {"job", "slurm job 77"},
                                                        {"job_key", "node-elsewhere:29500/8"},
                                                        {"started", now - 7200},
                                                        {"heartbeat", now - heartbeat_age_s},
                                                        {"token", "elsewhere"}}
                                            .dump();
}
}  // namespace

TEST_CASE("claim: a second job on a busy checkpoint.dir is refused - the first is unharmed", "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path();
  const auto alone = bash(tiny_command("--set training.steps=120 --set checkpoint.dir=" + d + "/alone " +
                                       "--set logging.metrics_file=" + d + "/alone.jsonl"));
  REQUIRE(alone.exit_code == 0);
  const auto r = bash(tiny_command("--set training.steps=120 --set checkpoint.dir=" + d + "/ck --set " +
                                   "logging.metrics_file=" + d + "/first.jsonl") +
                      " > " + d + "/first.out 2>&1 & P=$!\n"
                      "for i in $(seq 1 600); do grep -q '^step ' " + d + "/first.out && break; sleep 0.05; done\n" +
                      tiny_command("--set training.steps=120 --set checkpoint.dir=" + d + "/ck") + " > " + d +
                      "/second.out 2>&1; echo \"second $?\"\n"
                      "wait $P; echo \"first $?\"\n");
  const std::string second = read_file(d + "/second.out");
  INFO(r.out << r.err << second << read_file(d + "/first.out"));
  CHECK(r.out.find("second 2") != std::string::npos);
  CHECK(r.out.find("first 0") != std::string::npos);
  CHECK(second.find("error: checkpoint.dir " + d + "/ck is in use by a job (pid ") != std::string::npos);
  CHECK(second.find("stop that job first, use another checkpoint.dir, or pass --force") != std::string::npos);
  CHECK(second.find("step ") == std::string::npos);  // refused before training
  CHECK(losses(d + "/first.jsonl") == losses(d + "/alone.jsonl"));  // bit-identical to running alone
  CHECK_FALSE(std::filesystem::exists(d + "/ck/.claim.json"));    // released at the end
}

TEST_CASE("claim: a SIGKILLed job's directory is taken over and the run resumes bit-exactly", "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path();
  const auto reference = bash(tiny_command("--set training.steps=40 --set logging.metrics_file=" + d + "/ref.jsonl"));
  REQUIRE(reference.exit_code == 0);
  const auto killed = bash(tiny_command("--set training.steps=100000 --set checkpoint.interval=5 --set "
                                        "checkpoint.keep=0 --set checkpoint.dir=" + d + "/ck") +
                           " > " + d + "/killed.out 2>&1 & P=$!\n"
                           "for i in $(seq 1 1200); do grep -q 'step-00000010 committed' " + d +
                           "/killed.out && break; sleep 0.05; done\n"
                           "kill -KILL $P; wait $P; exit 0\n");
  REQUIRE(killed.exit_code == 0);
  REQUIRE(std::filesystem::exists(d + "/ck/.claim.json"));  // left behind by the dead job
  const auto resumed = bash(tiny_command("--set training.steps=40 --set checkpoint.dir=" + d + "/ck --set " +
                                         "logging.metrics_file=" + d + "/resumed.jsonl"));
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK(resumed.err.find("warning: checkpoint.dir " + d + "/ck: taking over the claim of a job (pid ") !=
        std::string::npos);
  CHECK(resumed.err.find("no longer exists on") != std::string::npos);
  const auto ref = losses(d + "/ref.jsonl"), after = losses(d + "/resumed.jsonl");
  REQUIRE(!after.empty());
  REQUIRE(after.size() < ref.size());
  for (size_t i = 0; i < after.size(); ++i)  // the resumed steps are the reference's last ones, bit for bit
    CHECK(after[i] == ref[ref.size() - after.size() + i]);
}

TEST_CASE("claim: another host's stale claim is taken over - a fresh one refused unless --force", "[checkpoint][claim]") {
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  REQUIRE(bash(tiny_command("--set training.steps=2 --set checkpoint.dir=" + ck)).exit_code == 0);

  write_claim(ck, "node-elsewhere", 1);
  const auto inspect = run_process({trainer_binary(), "ckpt", "inspect", ck});
  INFO(inspect.out << inspect.err);
  CHECK(inspect.out.find("claim: slurm job 77 (pid 4567 on node-elsewhere) since ") != std::string::npos);
  CHECK(inspect.out.find(": live (heartbeat ") != std::string::npos);
  const auto refused = bash(tiny_command("--set training.steps=4 --set checkpoint.dir=" + ck));
  INFO(refused.out << refused.err);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("error: checkpoint.dir " + ck + " is in use by slurm job 77 (pid 4567 on node-elsewhere) "
                         "since ") != std::string::npos);
  const auto forced = bash(tiny_command("--set training.steps=4 --set checkpoint.dir=" + ck) + " --force");
  INFO(forced.out << forced.err);
  CHECK(forced.exit_code == 0);
  CHECK(forced.err.find("taking over the claim of slurm job 77 (pid 4567 on node-elsewhere)") != std::string::npos);
  CHECK(forced.err.find("as --force asks") != std::string::npos);

  write_claim(ck, "node-elsewhere", 3600);
  const auto stale = bash(tiny_command("--set training.steps=6 --set checkpoint.dir=" + ck));
  INFO(stale.out << stale.err);
  CHECK(stale.exit_code == 0);
  CHECK(stale.err.find("taking over the claim of slurm job 77 (pid 4567 on node-elsewhere)") != std::string::npos);
  CHECK(stale.err.find("its heartbeat is 360") != std::string::npos);
  CHECK(stale.err.find(" s old, stale after 60 s)") != std::string::npos);
}

TEST_CASE("claim: a multi-rank job claims its directory once", "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path();
  const auto r = bash(tiny_command("--nproc-per-node 2 --set training.steps=150 --set checkpoint.dir=" + d + "/ck") +
                      " > " + d + "/job.out 2>&1 & P=$!\n"
                      "for i in $(seq 1 1200); do grep -q '^step ' " + d + "/job.out && break; sleep 0.05; done\n"
                      "ls -a " + d + "/ck > " + d + "/listing.txt; cp " + d + "/ck/.claim.json " + d + "/claim.json\n"
                      "wait $P; echo \"job $?\"\n");
  INFO(r.out << r.err << read_file(d + "/job.out"));
  CHECK(r.out.find("job 0") != std::string::npos);  // rank 1 accepted its own job's claim
  const std::string listing = read_file(d + "/listing.txt");
  INFO(listing);
  CHECK(std::count(listing.begin(), listing.end(), '\n') == 3);  // ".", ".." and the one claim file
  const auto claim = nlohmann::json::parse(read_file(d + "/claim.json"));
  CHECK(claim["job"].get<std::string>().rfind("local job (launcher pid ", 0) == 0);
  CHECK_FALSE(std::filesystem::exists(d + "/ck/.claim.json"));
}

TEST_CASE("claim: a job whose directory was taken over with --force stops at its next heartbeat", "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path();
  const auto r = bash(tiny_command("--set training.steps=100000 --set checkpoint.dir=" + d + "/ck") + " > " + d +
                          "/first.out 2>&1 & P=$!\n"
                          "for i in $(seq 1 600); do grep -q '^step ' " + d + "/first.out && break; sleep 0.05; done\n" +
                          tiny_command("--set training.steps=2 --set checkpoint.resume=none --set checkpoint.dir=" + d +
                                       "/ck") +
                          " --force > " + d + "/second.out 2>&1; echo \"second $?\"\n"
                          "wait $P; echo \"first $?\"\n",
                      120);
  const std::string first = read_file(d + "/first.out");
  INFO(r.out << r.err << first << read_file(d + "/second.out"));
  CHECK(r.out.find("second 0") != std::string::npos);
  CHECK(r.out.find("first 1") != std::string::npos);
  CHECK(first.find("training failed: checkpoint.dir " + d + "/ck was taken over by ") != std::string::npos);
  CHECK(first.find("this job stops without writing another checkpoint") != std::string::npos);
  CHECK(first.find("internal error") == std::string::npos);  // displaced, not a bug
}

TEST_CASE("claim: a job displaced with --force that then dies of SIGHUP leaves the new holder's claim alone",
          "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path(), claim = d + "/ck/.claim.json";
  // The hang-up reaches the first job as soon as the second job's claim is in place, long before
  // the first one's heartbeat (every 10 s) could notice that it lost the directory.
  const auto r = bash(tiny_command("--set training.steps=100000 --set checkpoint.dir=" + d + "/ck") + " > " + d +
                          "/first.out 2>&1 & A=$!\n"
                          "for i in $(seq 1 1200); do grep -q '^step ' " + d + "/first.out && break; sleep 0.05; done\n" +
                          tiny_command("--set training.steps=100000 --set checkpoint.resume=none --set checkpoint.dir=" +
                                       d + "/ck") +
                          " --force > " + d + "/second.out 2>&1 & B=$!\n"
                          "for i in $(seq 1 1200); do grep -q \"\\\"pid\\\": $B\\b\" " + claim +
                          " 2>/dev/null && break; sleep 0.05; done\n"
                          "kill -HUP $A; wait $A; echo \"first $?\"\n"
                          "grep -q \"\\\"pid\\\": $B\\b\" " + claim + " && echo 'second still holds it'\n"
                          "kill -KILL $B; wait $B 2>/dev/null; exit 0\n",
                      120);
  INFO(r.out << r.err << read_file(d + "/first.out") << read_file(d + "/second.out"));
  CHECK(r.out.find("first 129") != std::string::npos);  // died of the hang-up, not displaced at a heartbeat
  CHECK(r.out.find("second still holds it") != std::string::npos);  // the first job unlinked it before
}

TEST_CASE("claim: a killed holder that its parent has not reaped yet (a zombie) does not keep the directory",
          "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path();
  // The holder's parent is a subshell that becomes `sleep` and never waits for its child: once
  // killed, the holder stays a zombie (state Z) while its heartbeat is still fresh.
  const auto r = bash("( " + tiny_command("--set training.steps=100000 --set checkpoint.dir=" + d + "/ck") + " > " + d +
                      "/first.out 2>&1 & echo $! > " + d + "/pid; exec sleep 120 ) & H=$!\n"
                      "for i in $(seq 1 600); do grep -q '^step ' " + d + "/first.out 2>/dev/null && break; sleep 0.05; "
                      "done\n"
                      "P=$(cat " + d + "/pid); kill -KILL $P\n"
                      "for i in $(seq 1 100); do grep -q '^State:.*Z' /proc/$P/status && break; sleep 0.05; done\n"
                      "grep '^State:' /proc/$P/status\n" +
                      tiny_command("--set training.steps=2 --set checkpoint.resume=none --set checkpoint.dir=" + d +
                                   "/ck") +
                      " > " + d + "/second.out 2>&1; echo \"second $?\"\n"
                      "kill $H; wait $H 2>/dev/null; exit 0\n",
                      120);
  const std::string second = read_file(d + "/second.out");
  INFO(r.out << r.err << second << read_file(d + "/first.out"));
  CHECK(r.out.find("State:\tZ (zombie)") != std::string::npos);
  CHECK(r.out.find("second 0") != std::string::npos);  // refused as "in use" (exit 2) before
  CHECK(second.find("taking over the claim of a job (pid ") != std::string::npos);
  CHECK(second.find("has exited (a zombie its parent has not reaped yet)") != std::string::npos);
}

TEST_CASE("claim: a live holder whose command name holds spaces - ')' and a newline - is seen as alive",
          "[checkpoint][claim]") {
  TempDir dir;
  const std::string d = dir.path(), ck = d + "/ck";
  // The kernel names a process after its executable's file name (15 bytes at most).
  const std::string odd = d + "/a b)\n(c) d";
  std::filesystem::copy_file("/bin/sleep", odd);
  std::filesystem::permissions(odd, std::filesystem::perms::owner_all);
  // A child of this process, so that it stays alive (not a zombie) until it is killed and reaped here.
  const std::string seconds = "60";
  char* const argv[] = {const_cast<char*>(odd.c_str()), const_cast<char*>(seconds.c_str()), nullptr};
  pid_t pid = 0;
  REQUIRE(::posix_spawn(&pid, odd.c_str(), nullptr, nullptr, argv, environ) == 0);
  std::string stat;
  for (int i = 0; i < 100 && stat.find("(a b)\n(c) d)") == std::string::npos; ++i) {  // until it has exec'd
    ::usleep(20000);
    stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  }
  REQUIRE(stat.find("(a b)\n(c) d)") != std::string::npos);
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // from state (field 3) on
  std::string start;
  for (int field = 3; field <= 22; ++field) fields >> start;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::filesystem::create_directories(ck);
  std::ofstream(ck + "/.claim.json") << nlohmann::json{{"host", host},       {"pid", int64_t(pid)},          {"process_start", start},
                                                       {"job", "odd job"},   {"job_key", "k"},      {"started", now},
                                                       {"heartbeat", now},   {"token", "odd"}}
                                            .dump();
  const auto r = bash(tiny_command("--set training.steps=1 --set checkpoint.resume=none --set checkpoint.dir=" + ck), 60);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);  // taken over as "no longer exists" before (the stat file was read up to the newline)
  CHECK(r.err.find("is in use by odd job (pid " + std::to_string(pid)) != std::string::npos);
}

TEST_CASE("claim: a damaged claim file reads as a dead claim - never a crash - a hang or an internal error",
          "[checkpoint][claim]") {
  TempDir dir;
  const std::string ck = dir.path() + "/ck";
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {"wrong types", R"({"host": 7, "pid": "4567", "heartbeat": "now", "started": [], "token": {}})"},
      {"pid -1", R"({"host": "HOST", "pid": -1, "heartbeat": 1e300})"},
      {"huge numbers", R"({"pid": 1e30, "started": 1e300, "heartbeat": -5})"},
      {"nested deeply", std::string(100000, '[') + std::string(100000, ']')},
      {"not JSON", "\x01\x02 garbage"},
      {"empty", ""},
  };
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  int ran = 0;
  for (auto [name, text] : damaged) {
    if (auto at = text.find("HOST"); at != std::string::npos) text.replace(at, 4, host);
    std::filesystem::create_directories(ck);
    std::ofstream(ck + "/.claim.json", std::ios::trunc) << text;
    const auto r = bash(tiny_command("--set training.steps=1 --set checkpoint.resume=none --set checkpoint.dir=" + ck),
                        60);
    INFO(name << ": " << r.out << r.err);
    CHECK(!r.timed_out);
    CHECK(r.signal == 0);
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("taking over the claim of") != std::string::npos);
    const auto inspect = run_process({trainer_binary(), "ckpt", "inspect", ck}, 30);
    CHECK(inspect.signal == 0);
    CHECK(inspect.err.find("internal error") == std::string::npos);
    ++ran;
  }
  // A FIFO or a directory in the claim's place: not read (it would block), never taken for live.
  std::filesystem::create_directories(ck);
  REQUIRE(::mkfifo((ck + "/.claim.json").c_str(), 0600) == 0);
  const auto fifo = bash(tiny_command("--set training.steps=1 --set checkpoint.resume=none --set checkpoint.dir=" + ck),
                         60);
  INFO(fifo.out << fifo.err);
  CHECK(!fifo.timed_out);
  CHECK(fifo.exit_code == 0);
  std::filesystem::create_directories(ck + "/.claim.json");
  const auto directory = bash(
      tiny_command("--set training.steps=1 --set checkpoint.resume=none --set checkpoint.dir=" + ck), 60);
  INFO(directory.out << directory.err);
  CHECK(directory.exit_code == 2);
  CHECK(directory.err.find("cannot remove the dead claim " + ck + "/.claim.json") != std::string::npos);
  WARN("damaged claim files: " << ran + 2 << " runs, signals 0, hangs 0");
}
