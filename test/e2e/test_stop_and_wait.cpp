// Stopping and waiting through the binary: a rank waiting at the rendezvous says so, gives up once
// after parallel.collective_timeout_s, and stops at once on SIGINT/SIGTERM (the launcher passing the
// signal on and exiting with its workers' code); the first Ctrl-C of a run is acknowledged at once
// and a second one removes the checkpoint directory's claim; a run that cannot fit in memory is
// refused before it starts, and an allocation that fails anyway is reported as out of memory.
// Also what happens before training: data.paths without data.source means token files.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>
#include <utility>

#include "process.h"

using namespace trainer::test;

namespace {

const std::string kTiny = std::string(TRAINER_SOURCE_DIR) + "/recipes/tiny-llama.json";

// A TCP socket bound to a port of 127.0.0.1 that the kernel chose, listening when `backlog` > 0:
// the socket and its port.
std::pair<int, std::string> loopback_socket(int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  if (backlog > 0) REQUIRE(::listen(fd, backlog) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  return {fd, std::to_string(ntohs(address.sin_port))};
}

// A TCP port on 127.0.0.1 that nobody listens on (the kernel's choice, released again).
std::string unused_port() {
  const auto [fd, port] = loopback_socket(0);
  ::close(fd);
  return port;
}

ProcessResult bash(const std::string& script, double timeout = 120) {
  return run_process({"/bin/bash", "-c", script}, timeout, {"OMP_NUM_THREADS=1"});
}

// The number after `label ` in `text` (-1 when absent).
long long number_after(const std::string& text, const std::string& label) {
  std::smatch match;
  if (!std::regex_search(text, match, std::regex(label + " (-?[0-9]+)"))) return -1;
  return std::stoll(match[1]);
}

// Steps of a second or more on one CPU thread (on a GPU they would take milliseconds), so that a
// signal arrives in the middle of one.
const std::string kSlowSteps =
    " --cpu --set model.hidden_size=512 --set model.intermediate_size=1536 --set model.num_attention_heads=8"
    " --set model.num_key_value_heads=8 --set training.seq_len=256 --set model.max_position_embeddings=256"
    " --set training.micro_batch_size=8 --set training.global_batch_size=8 --set logging.interval=1"
    " --set training.steps=100000 --set optimizer.warmup_steps=2";

// Waits (in the script) until `file` holds a line matching `pattern`, at most `seconds`.
std::string wait_for(const std::string& file, const std::string& pattern, int seconds = 120) {
  return "for i in $(seq 1 " + std::to_string(seconds * 20) + "); do grep -q '" + pattern + "' " + file +
         " 2>/dev/null && break; sleep 0.05; done\n";
}

}  // namespace

TEST_CASE("rendezvous: a node waiting for node 0 says so and gives up once after collective_timeout_s", "[stop]") {
  const std::string port = unused_port();
  const auto r = run_process({trainer_binary(), "run", kTiny, "--nnodes", "2", "--node-rank", "1", "--set",
                              "parallel.collective_timeout_s=3"},
                             60, {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "OMP_NUM_THREADS=1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 10);  // once (c10d used to try twice), and not minutes
  CHECK(r.err.find("rank 1: waiting for node 0 at 127.0.0.1:" + port + " (not reachable yet: Connection refused); "
                   "waited ") != std::string::npos);
  CHECK(r.err.find(" of 3 s (parallel.collective_timeout_s)") != std::string::npos);
  CHECK(r.err.find("rank 1: no rendezvous at 127.0.0.1:" + port + " (address from MASTER_ADDR) within 3 s "
                   "(parallel.collective_timeout_s): node 0's store never became reachable (Connection refused)") !=
        std::string::npos);
  CHECK(r.err.find("Interrupted system call") == std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
  CHECK(r.err.find("Exception raised from") == std::string::npos);  // no c10 backtraces
}

TEST_CASE("rendezvous: SIGTERM or SIGINT while waiting stops at once with 143 or 130", "[stop]") {
  TempDir dir;
  const std::string d = dir.path(), port = unused_port();
  for (const std::string signal : {"TERM", "INT"}) {
    INFO("SIG" << signal);
    // As in the issue: `timeout` sends SIGTERM to the launcher, which passes it on to its worker.
    const auto r = bash("export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + "\n" + trainer_binary() + " run " + kTiny +
                        " --nnodes 2 --node-rank 1 --set parallel.collective_timeout_s=120 > " + d + "/out 2> " + d +
                        "/err & P=$!\n" + wait_for(d + "/err", "waiting for node 0") +
                        "S=$(date +%s%N); kill -" + signal + " $P; wait $P; echo \"exit $?\"\n"
                        "echo \"took_ms $(( ($(date +%s%N) - S) / 1000000 ))\"\n");
    const std::string err = read_file(d + "/err");
    INFO(r.out << r.err << err);
    CHECK(r.out.find(signal == "TERM" ? "exit 143" : "exit 130") != std::string::npos);
    const long long took = number_after(r.out, "took_ms");
    CHECK(took >= 0);
    CHECK(took < 5000);  // c10d alone: minutes (slack for a loaded 2-core CI machine; the wait polls every 0.05-0.2 s)
    CHECK(err.find("rank 1: stopped by SIG" + signal + " while waiting for node 0 at 127.0.0.1:" + port +
                   " (not reachable yet: Connection refused); nothing was started") != std::string::npos);
    CHECK(err.find("exited with code") == std::string::npos);  // the launcher reports no failure
    CHECK(err.find("Interrupted system call") == std::string::npos);
  }
}

TEST_CASE("rendezvous: node 0's launcher counts who came - passes a signal to its workers and reaps them", "[stop]") {
  TempDir dir;
  const std::string d = dir.path(), port = unused_port();
  const auto r = bash("export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + "\n" + trainer_binary() + " run " + kTiny +
                      " --nproc-per-node 2 --nnodes 2 --node-rank 0 --set parallel.collective_timeout_s=120"
                      " --set checkpoint.dir=" + d + "/ck > " + d + "/out 2> " + d + "/err & P=$!\n" +
                      wait_for(d + "/err", "waiting for the other ranks") +
                      "S=$(date +%s%N); kill -INT $P; wait $P; echo \"exit $?\"\n"
                      "echo \"took_ms $(( ($(date +%s%N) - S) / 1000000 ))\"\n"
                      "pgrep -f '[t]rainer worker rank.*" + d + "/ck' > /dev/null && echo 'left behind' || echo 'all gone'\n");
  const std::string err = read_file(d + "/err");
  INFO(r.out << r.err << err);
  CHECK(r.out.find("exit 130") != std::string::npos);
  const long long took = number_after(r.out, "took_ms");
  CHECK(took >= 0);
  CHECK(took < 5000);  // minutes before (slack for a loaded machine)
  CHECK(r.out.find("all gone") != std::string::npos);  // every worker was reaped
  CHECK(err.find("rank 0: waiting for the other ranks at 127.0.0.1:" + port +
                 " (1 of 2 nodes present, 2 of 4 ranks); waited ") != std::string::npos);
  CHECK(err.find("rank 0: stopped by SIGINT while waiting for the other ranks at 127.0.0.1:" + port +
                 " (1 of 2 nodes present, 2 of 4 ranks); nothing was started") != std::string::npos);
  CHECK(err.find("exited with code") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(d + "/ck/.claim.json"));  // rank 0 had claimed it before waiting
}

TEST_CASE("stop: the first Ctrl-C is acknowledged at once - the run checkpoints the step it names", "[stop]") {
  TempDir dir;
  const std::string d = dir.path();
  const auto r = bash(trainer_binary() + " run " + kTiny + kSlowSteps + " --set checkpoint.dir=" + d + "/ck > " + d +
                      "/out 2> " + d + "/err & P=$!\n" + wait_for(d + "/out", "^step ") +
                      "B=$(grep -c '^step ' " + d + "/out); S=$(date +%s%N); kill -INT $P\n" +
                      wait_for(d + "/err", "stop requested", 30) +
                      "echo \"ack_ms $(( ($(date +%s%N) - S) / 1000000 ))\"\n"
                      "echo \"steps_between $(( $(grep -c '^step ' " + d + "/out) - B ))\"\n"
                      "wait $P; echo \"exit $?\"\n");
  const std::string out = read_file(d + "/out"), err = read_file(d + "/err");
  INFO(r.out << r.err << out << err);
  CHECK(r.out.find("exit 0") != std::string::npos);
  const long long ack = number_after(r.out, "ack_ms");
  CHECK(ack >= 0);
  CHECK(ack < 10000);
  // From the handler, in the middle of the step the signal interrupted (which takes over a second),
  // not after it: no step ended between the signal and the acknowledgement. (Relative to the step,
  // so that a loaded machine, which slows both, does not make it flaky.)
  CHECK(number_after(r.out, "steps_between") == 0);
  const long long named = number_after(err, "stop requested \\(SIGINT\\): finishing step");
  REQUIRE(named > 0);
  CHECK(err.find("stop requested (SIGINT): finishing step " + std::to_string(named) +
                 ", then writing a checkpoint; press Ctrl-C again to stop without one") != std::string::npos);
  CHECK(number_after(out, "stopping after step") == named);  // the step it said
  char step_dir[32];
  std::snprintf(step_dir, sizeof(step_dir), "/ck/step-%08lld", named);
  CHECK(std::filesystem::exists(d + step_dir + "/manifest.json"));
  CHECK_FALSE(std::filesystem::exists(d + "/ck/.claim.json"));
}

TEST_CASE("stop: a second Ctrl-C stops at once without a checkpoint and removes the claim", "[stop]") {
  TempDir dir;
  const std::string d = dir.path();
  const auto r = bash(trainer_binary() + " run " + kTiny + kSlowSteps + " --set checkpoint.dir=" + d + "/ck > " + d +
                      "/out 2> " + d + "/err & P=$!\n" + wait_for(d + "/out", "^step ") +
                      "kill -INT $P; sleep 1.2; kill -INT $P; wait $P; echo \"exit $?\"\n");
  const std::string out = read_file(d + "/out"), err = read_file(d + "/err");
  INFO(r.out << r.err << out << err);
  CHECK(r.out.find("exit 130") != std::string::npos);
  CHECK(err.find("stop requested (SIGINT): finishing step ") != std::string::npos);
  CHECK(err.find("second stop request: stopping now, without a checkpoint") != std::string::npos);
  CHECK(out.find("stopping after step") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(d + "/ck/.claim.json"));  // a stale claim was left before
}

TEST_CASE("memory: a run that cannot fit is refused before it starts - a failed allocation says out of memory",
          "[stop][memory]") {
  // ulimit -v makes the limit the same on every machine: 6 GiB of address space, of which libtorch
  // maps part; the wide model below needs tens of GiB (fp32 weights, gradients and Adam moments).
  const std::string limit = "ulimit -v 6291456\n";
  const std::string wide = " --cpu --set model.hidden_size=4096 --set model.intermediate_size=16384"
                           " --set model.num_hidden_layers=8 --set training.steps=1";
  const auto refused = bash(limit + trainer_binary() + " run " + kTiny + wide);
  INFO(refused.out << refused.err);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("error: " + kTiny + ": this run needs about ") != std::string::npos);
  CHECK(refused.err.find(" of memory per rank (the estimate's peak), but the CPU has ") != std::string::npos);
  CHECK(refused.err.find("(the address-space limit (ulimit -v) 6.0 GiB less the ") != std::string::npos);
  CHECK(refused.err.find("--set training.recompute=full") != std::string::npos);
  CHECK(refused.err.find("To start anyway, pass --no-memory-check") != std::string::npos);
  CHECK(refused.out.find("step ") == std::string::npos);

  const auto failed = bash(limit + trainer_binary() + " run " + kTiny + wide + " --no-memory-check");
  INFO(failed.out << failed.err);
  CHECK(failed.exit_code == 1);
  CHECK(failed.signal == 0);
  CHECK(failed.err.find("training failed: out of memory on the CPU (") != std::string::npos);
  CHECK(failed.err.find("); the estimate for this run is ") != std::string::npos);
  CHECK(failed.err.find("internal error") == std::string::npos);
  CHECK(failed.err.find("Exception raised from") == std::string::npos);

  // The launcher refuses once, before starting workers that share the host.
  const auto launched = bash(limit + trainer_binary() + " run " + kTiny + wide + " --nproc-per-node 2");
  INFO(launched.out << launched.err);
  CHECK(launched.exit_code == 2);
  CHECK(launched.err.find("error: " + kTiny + ": this run needs about ") == 0);

  // A run that fits trains under the same limit.
  const auto fits = bash(limit + trainer_binary() + " run " + kTiny + " --cpu --set training.steps=2");
  INFO(fits.out << fits.err);
  CHECK(fits.exit_code == 0);
}

TEST_CASE("recipe: data.paths without data.source means token files", "[stop][recipe]") {
  TempDir dir;
  auto recipe = nlohmann::json::parse(read_file(kTiny));
  recipe.erase("data");  // tiny-llama says "synthetic" explicitly
  const std::string file = dir.write("r.json", recipe.dump());
  const std::string paths = "data.paths=[\"" + dir.path() + "/web\"]";
  const auto inferred = run_process({trainer_binary(), "validate", file, "--set", paths});
  INFO(inferred.out << inferred.err);
  CHECK(inferred.exit_code == 0);
  CHECK(inferred.out.find("\"source\": \"tokens\"") != std::string::npos);
  // Said explicitly, synthetic stays, and the contradiction is refused.
  const auto explicit_source = run_process({trainer_binary(), "validate", file, "--set", paths, "--set",
                                            "data.source=synthetic"});
  INFO(explicit_source.out << explicit_source.err);
  CHECK(explicit_source.exit_code == 2);
  CHECK(explicit_source.err.find("data.paths is set but data.source is \"synthetic\"") != std::string::npos);
}

TEST_CASE("recipe: a FIFO in place of the recipe is refused at once - not waited on", "[stop][recipe]") {
  TempDir dir;
  const std::string fifo = dir.path() + "/recipe.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  for (const char* command : {"validate", "run"}) {
    const auto r = run_process({trainer_binary(), command, fifo}, 10);
    INFO(command << ": " << r.out << r.err);
    CHECK(!r.timed_out);  // blocked in open() until killed before
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(fifo + ": not a regular file (a FIFO)") != std::string::npos);
  }
}

TEST_CASE("rendezvous: node 0 given a MASTER_PORT that is taken says so (exit 2)", "[stop]") {
  const auto [holder, port] = loopback_socket(1);
  const auto r = run_process({trainer_binary(), "run", kTiny, "--nnodes", "2", "--node-rank", "0"}, 30,
                             {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "OMP_NUM_THREADS=1"});
  ::close(holder);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);  // "internal error" before
  CHECK(r.err.find("error: cannot listen on TCP port " + port + " (MASTER_PORT) of this host: Address already in "
                   "use; choose a free port for MASTER_PORT") != std::string::npos);
}

TEST_CASE("rendezvous: a MASTER_PORT where something else listens fails once at the timeout - and a signal still stops "
          "it", "[stop]") {
  // A socket that listens and never answers: connections complete in its backlog, no store replies.
  const auto [silent, port] = loopback_socket(64);
  const std::vector<std::string> env = {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "OMP_NUM_THREADS=1"};
  const auto r = run_process({trainer_binary(), "run", kTiny, "--nnodes", "2", "--node-rank", "1", "--set",
                              "parallel.collective_timeout_s=3"},
                             60, env);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(r.seconds < 10);  // c10d alone retried for minutes past its timeout
  CHECK(r.err.find("rank 1: no rendezvous at 127.0.0.1:" + port + " (address from MASTER_ADDR) within 3 s "
                   "(parallel.collective_timeout_s): the port accepts connections but no rendezvous store answered "
                   "there") != std::string::npos);
  TempDir dir;
  const auto stopped = bash("export MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + "\n" + trainer_binary() + " run " +
                            kTiny + " --nnodes 2 --node-rank 1 > " + dir.path() + "/out 2> " + dir.path() +
                            "/err & P=$!\n" + wait_for(dir.path() + "/err", "connecting to the store") +
                            "S=$(date +%s%N); kill -TERM $P; wait $P; echo \"exit $?\"\n"
                            "echo \"took_ms $(( ($(date +%s%N) - S) / 1000000 ))\"\n");
  ::close(silent);
  const std::string err = read_file(dir.path() + "/err");
  INFO(stopped.out << err);
  CHECK(stopped.out.find("exit 143") != std::string::npos);
  const long long took = number_after(stopped.out, "took_ms");
  CHECK(took >= 0);
  CHECK(took < 2000);
  CHECK(err.find("rank 1: stopped by SIGTERM while connecting to the store at 127.0.0.1:" + port +
                 " (the port accepts connections, but no store has answered yet); nothing was started") !=
        std::string::npos);
}

TEST_CASE("run: a profiling.dir that cannot be made is refused before the first step", "[stop][recipe]") {
  TempDir dir;
  const std::string file = dir.write("a-file", "x");
  const auto r = run_process({trainer_binary(), "run", kTiny, "--set", "training.steps=3", "--set",
                              "profiling.steps=[1,2]", "--set", "profiling.dir=" + file + "/traces"},
                             60, {"OMP_NUM_THREADS=1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);  // "internal error: filesystem error" after step 1 before
  CHECK(r.err.find("error: profiling.dir " + file + "/traces: cannot be created (Not a directory)") !=
        std::string::npos);
  CHECK(r.out.find("step 1/") == std::string::npos);
}

TEST_CASE("run: a FIFO as logging.metrics_file is refused - not waited on", "[stop][recipe]") {
  TempDir dir;
  const std::string fifo = dir.path() + "/metrics";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto r = run_process({trainer_binary(), "run", kTiny, "--set", "training.steps=2", "--set",
                              "logging.metrics_file=" + fifo},
                             30, {"OMP_NUM_THREADS=1"});
  INFO(r.out << r.err);
  CHECK(!r.timed_out);  // blocked in open() until killed before
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("error: " + fifo + ": is a FIFO, not a metrics file") != std::string::npos);
}

TEST_CASE("stop: SIGHUP - an abort or a crash still removes the checkpoint directory's claim", "[stop]") {
  TempDir dir;
  const std::string d = dir.path();
  for (const auto& [signal, status] : std::vector<std::pair<std::string, int>>{{"HUP", 129}, {"ABRT", 134}, {"SEGV", 139}}) {
    INFO("SIG" << signal);
    const std::string ck = d + "/ck-" + signal;
    // One output file per run: with a shared one the wait could see the previous run's step lines
    // before the new process truncates it, and look for the claim too early.
    const std::string out = d + "/out-" + signal, err = d + "/err-" + signal;
    // No core file: a machine whose core_pattern pipes cores to a collector would spend seconds on one.
    const auto r = bash("ulimit -c 0\n" + trainer_binary() + " run " + kTiny +
                        " --set training.steps=100000 --set logging.interval=1" +
                        " --set checkpoint.dir=" + ck + " > " + out + " 2> " + err + " & P=$!\n" +
                        wait_for(out, "^step ") + "test -f " + ck + "/.claim.json && echo claimed\n"
                        "kill -" + signal + " $P; wait $P; echo \"exit $?\"\n");
    INFO(r.out << r.err << read_file(err));
    CHECK(r.out.find("claimed") != std::string::npos);
    CHECK(r.out.find("exit " + std::to_string(status)) != std::string::npos);  // dies of the signal, as before
    CHECK_FALSE(std::filesystem::exists(ck + "/.claim.json"));                  // left behind before
  }
}
