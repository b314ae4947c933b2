// trainer run RECIPE [--set K=V]... [--nproc-per-node N [--nnodes M --node-rank R]] [--dry-run] [--cpu]
#include <fmt/format.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "commands.h"
#include "failure_report.h"
#include "memory_fit.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/dir_claim.h"
#include "core/error.h"
#include "estimate/estimate_command.h"
#include "metrics/metrics_file.h"
#include "mesh/process_groups.h"
#include "recipe/load.h"
#include "runtime/cpu_threads.h"
#include "runtime/device_assignment.h"
#include "runtime/launch_env.h"
#include "runtime/launch_policy.h"
#include "runtime/local_launcher.h"
#include "runtime/rendezvous.h"
#include "runtime/stop_signal.h"
#include "train/run_plan.h"
#include "train/trainer.h"

namespace trainer::app {

namespace {

struct RunOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc_per_node = 1;
  int nnodes = 1, node_rank = 0;  // torchrun's: one launch per host, MASTER_ADDR/MASTER_PORT name node 0
  bool dry_run = false;
  bool cpu = false;
  bool force = false;  // take checkpoint.dir over even from a job that looks alive
  bool no_memory_check = false;  // start even when the estimate says the run does not fit
  std::optional<int> max_restarts;  // --max-restarts; none: checkpoint.max_restarts
  std::vector<std::string> argv;  // the whole command line, for the local launcher
};

// The run's plan on this worker's device (train/run_plan.h). Parallel features whose runtime has
// not landed yet (on any device, or on the GPUs this worker will use) are refused before anything
// starts.
train::RunPlan plan_supported_run(const recipe::LoadedRecipe& loaded, const runtime::DeviceAssignment& device) {
  train::RunPlan plan = train::plan_run(loaded, device);
  if (!plan.support_problems.empty()) throw RecipeError(loaded.source, plan.support_problems);
  return plan;
}

// This worker's device and backend (parallel.backend, --cpu, the node's GPUs); a layout that cannot
// work is a recipe error.
runtime::DeviceAssignment assign_device(const recipe::LoadedRecipe& loaded, const RunOptions& options,
                                        int64_t local_rank, int64_t local_world_size) {
  try {
    return runtime::assign_device({loaded.recipe.parallel.backend, options.cpu, local_rank, local_world_size,
                                   at::hasCUDA() ? int(at::getNumGPUs()) : 0});
  } catch (const UserError& e) {
    throw RecipeError(loaded.source, {e.what()});
  }
}

// While it lives, a stop that kills the process (a second Ctrl-C, SIGHUP, abort) removes the claim
// file first, if it is still this job's (not one that --force gave to another job); the claim's own
// destructor removes it on every other way out.
class ClaimCleanup {
 public:
  explicit ClaimCleanup(const checkpoint::DirClaim& claim) {
    runtime::StopSignal::remove_on_hard_stop(claim.path(), claim.token());
  }
  ~ClaimCleanup() { runtime::StopSignal::remove_on_hard_stop(""); }
  ClaimCleanup(const ClaimCleanup&) = delete;
  ClaimCleanup& operator=(const ClaimCleanup&) = delete;
};

// The newest checkpoint in checkpoint.dir that this job committed (its manifest written at or after
// `since`, the job's first start; 0: any), or none.
std::optional<std::string> own_newest_checkpoint(const recipe::Recipe& recipe, int64_t since) {
  if (!recipe.checkpoint.dir) return std::nullopt;
  const auto newest = checkpoint::find_latest_checkpoint(*recipe.checkpoint.dir);
  if (!newest) return std::nullopt;
  struct stat manifest {};
  if (::stat((*newest + "/manifest.json").c_str(), &manifest) != 0) return std::nullopt;
  if (since > 0 && int64_t(manifest.st_mtime) < since) return std::nullopt;
  return newest;
}

// A restarted job (runtime/launch_env.h: TRAINER_RESTART) resumes from the newest checkpoint it
// committed, whatever checkpoint.resume says (that was the first start's choice); without one it
// starts as the recipe says. Rank 0 says so and records the restart in the metrics file.
recipe::LoadedRecipe load_for_restart(const RunOptions& options, const runtime::LaunchEnvironment& env,
                                      recipe::LoadOptions load, recipe::LoadedRecipe loaded) {
  const std::optional<std::string> newest = own_newest_checkpoint(loaded.recipe, env.restart_since);
  if (newest) {
    load.overrides.push_back("checkpoint.resume=" + *newest);
    loaded = recipe::load_recipe(options.recipe_path, load);
  }
  if (env.rank != 0) return loaded;
  std::printf("restart %lld: %s%s\n", (long long)env.restart,
              newest ? fmt::format("resuming from {}, the newest checkpoint this job committed", *newest).c_str()
                     : "no checkpoint of this job yet: starting as the recipe says",
              env.restart_cause.empty() ? "" : fmt::format(" (after: {})", env.restart_cause).c_str());
  if (const auto& path = loaded.recipe.logging.metrics_file) {
    metrics::MetricsFile file(*path);
    file.write(nlohmann::json{{"event", "restart"},
                              {"restart", env.restart},
                              {"cause", env.restart_cause},
                              {"resume_from", newest ? nlohmann::json(*newest) : nlohmann::json()},
                              {"unix_time", double(std::chrono::duration<double>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count())}});
  }
  return loaded;
}

// `preloaded`: the recipe as run_training loaded it at this worker's world size (a standalone
// process), so that it is read once.
int run_worker(const RunOptions& options, const runtime::LaunchEnvironment& env,
               std::optional<recipe::LoadedRecipe> preloaded = std::nullopt) {
  // First, so that a signal from here on is answered (and a second one removes the claim).
  runtime::StopSignal::install();
  recipe::LoadOptions load;
  load.overrides = options.overrides;
  load.world_size = env.world_size;
  recipe::LoadedRecipe first = preloaded ? std::move(*preloaded) : recipe::load_recipe(options.recipe_path, load);
  const recipe::LoadedRecipe loaded =
      env.restart > 0 ? load_for_restart(options, env, load, std::move(first)) : std::move(first);
  const runtime::DeviceAssignment device = assign_device(loaded, options, env.local_rank, env.local_world_size);
  const train::RunPlan plan = plan_supported_run(loaded, device);
  if (env.rank == 0) recipe::print_warnings(loaded, stderr);  // the same on every rank: once
  const runtime::CpuThreads threads = runtime::choose_cpu_threads(env.local_world_size);
  at::set_num_threads(threads.threads);
  // Every rank checks before the rendezvous, so no rank has allocated its model yet.
  const MemoryFit memory = measure_memory_fit(loaded, device, env.local_world_size, threads.threads);
  if (!options.no_memory_check) check_memory_fit(loaded, memory);
  // One job per checkpoint directory, settled before any process group is made.
  std::unique_ptr<checkpoint::DirClaim> claim;
  if (const auto& dir = loaded.recipe.checkpoint.dir) {
    const checkpoint::ClaimIdentity me{env.job,
                                       fmt::format("{}:{}/{}", env.master_addr, env.master_port, env.world_size)};
    if (env.rank == 0)
      claim = checkpoint::DirClaim::acquire(*dir, me, options.force);
    else if (!options.force)
      checkpoint::DirClaim::check_not_claimed_by_other(*dir, me);
  }
  std::optional<ClaimCleanup> claim_cleanup;
  if (claim) claim_cleanup.emplace(*claim);
  if (env.rank == 0 && env.world_size > 1)
    std::printf("threads: %d intra-op thread%s per worker (%s; set OMP_NUM_THREADS to choose)\n", threads.threads,
                threads.threads == 1 ? "" : "s", threads.reason.c_str());

  std::unique_ptr<mesh::ProcessGroups> groups;
  if (env.world_size == 1) {
    groups = mesh::single_process_groups();
  } else {
    const auto store = runtime::connect_rendezvous(
        env, std::chrono::milliseconds(int64_t(loaded.recipe.parallel.collective_timeout_s * 1000)));
    auto context = std::make_shared<comm::CommContext>();
    context->global_rank = env.rank;
    context->timeout = std::chrono::milliseconds(int64_t(loaded.recipe.parallel.collective_timeout_s * 1000));
    mesh::Backend backend;
    if (device.nccl) {
      backend.kind = mesh::Backend::Kind::Nccl;  // one GPU per local rank
      backend.device_index = device.device_index;
    } else {
      backend.interface_address = env.local_world_size == env.world_size ? "127.0.0.1" : "";
      backend.stage_cuda_tensors = device.on_gpu;
    }
    groups = std::make_unique<mesh::ProcessGroups>(mesh::RankLayout(*loaded.mesh), env.rank, store, context, backend);
  }
  train::TrainOptions train_options;
  train_options.plan = &plan;
  train_options.claim = claim.get();
  train::TrainSummary summary;
  try {
    summary = train::train(loaded, *groups, train_options);
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    throw TrainingFailure(out_of_memory_message(e, loaded, memory));
  }
  if (env.rank == 0 && !summary.nothing_to_do)
    std::printf("%s after step %lld of %lld; last loss %.4f%s\n", summary.stopped_by_signal ? "stopped" : "finished",
                (long long)summary.steps_completed, (long long)loaded.recipe.training.steps, summary.last_loss,
                summary.last_checkpoint.empty() ? "" : fmt::format("; checkpoint {}", summary.last_checkpoint).c_str());
  return 0;
}

int run_training(const RunOptions& options) {
  const runtime::LaunchEnvironment env = runtime::detect_launch_environment();
  if (options.dry_run) {
    // The same as `trainer estimate` at the world size this run would have.
    estimate::EstimateRequest request;
    request.recipe_path = options.recipe_path;
    request.overrides = options.overrides;
    request.world_size = env.world_size > 1 ? env.world_size : (options.nproc_per_node > 1 ? options.nproc_per_node : 0);
    // What `run` would do here: on a machine without a GPU it trains on the CPU.
    request.cpu = options.cpu || !at::hasCUDA();
    request.world_size_option = "--nproc-per-node";
    return estimate::run_estimate_command(request, stdout);
  }
  const runtime::LaunchRequest request{options.nproc_per_node, options.nnodes, options.node_rank};
  runtime::check_launch_request(request, env);
  // Without a launcher the recipe is read here, once: for the restarts, the local launch's checks
  // and a standalone process alike.
  std::optional<recipe::LoadedRecipe> here;
  if (env.launcher == "none") {
    recipe::LoadOptions load;
    load.overrides = options.overrides;
    load.world_size = int64_t(options.nproc_per_node) * options.nnodes;  // no int overflow
    here = recipe::load_recipe(options.recipe_path, load);
  }
  // Restarts need a launcher that outlives the workers: trainer's own, even for one worker.
  int restarts = 0;
  if (here) {
    restarts = options.max_restarts ? *options.max_restarts : int(here->recipe.checkpoint.max_restarts);
    if (restarts > 0 && options.nnodes > 1)
      throw UserError(fmt::format(
          "restarts ({}) with --nnodes {}: every host's launcher would have to restart together; run the job under "
          "Slurm (scripts/slurm/train.sbatch restarts the whole job) or set checkpoint.max_restarts=0",
          options.max_restarts ? fmt::format("--max-restarts {}", *options.max_restarts)
                               : fmt::format("checkpoint.max_restarts={}", restarts),
          options.nnodes));
  }
  if (runtime::starts_local_workers(request, env) || restarts > 0) {
    // Check the recipe once here, so a bad one fails before any worker starts.
    const recipe::LoadedRecipe& loaded = *here;
    const runtime::DeviceAssignment device = assign_device(loaded, options, 0, options.nproc_per_node);
    plan_supported_run(loaded, device);
    // On the CPU the workers share this host's memory: refuse before starting any. (GPUs are checked
    // by each worker, on its own device.)
    if (!device.on_gpu && !options.no_memory_check)
      check_memory_fit(loaded, measure_memory_fit(loaded, device, options.nproc_per_node,
                                                  runtime::choose_cpu_threads(options.nproc_per_node).threads));
    if (loaded.recipe.checkpoint.dir && !options.force)
      checkpoint::DirClaim::check_not_claimed_by_other(*loaded.recipe.checkpoint.dir, {});
    runtime::LocalLaunchOptions launch = runtime::local_launch_options(request);
    launch.argv = options.argv;
    launch.max_restarts = restarts;
    return runtime::launch_local_workers(launch);
  }
  runtime::check_no_local_launch_under_launcher(request, env);
  if (options.max_restarts && *options.max_restarts > 0)
    throw UserError(fmt::format(
        "--max-restarts restarts the workers trainer starts itself, but {} started this one: restart the whole job "
        "from outside: scripts/restart_job --max-restarts N srun|mpirun ... (scripts/slurm/train.sbatch does so; "
        "docs/distributed.md#restarts)",
        env.launcher == "slurm" ? "srun" : env.launcher == "openmpi" || env.launcher == "pmi" ? "mpirun" : "a launcher"));
  if (env.world_size == 1 && env.failure_dir.empty()) return run_worker(options, env, std::move(here));
  // Several ranks: name this one in every error, so the failing rank is obvious in the job's log.
  // Under a launcher that restarts the job, the message also goes to its failure directory.
  try {
    return run_worker(options, env, std::move(here));
  } catch (const std::exception&) {
    FailureScope scope;
    if (env.world_size > 1) scope.rank = env.rank;
    scope.print_interrupt = env.local_rank == 0;  // a stop signal reached every rank: its message once per node
    if (!env.failure_dir.empty()) scope.record_file = fmt::format("{}/rank-{}.txt", env.failure_dir, env.rank);
    return report_failure(scope);
  }
}

}  // namespace

CommandAction add_run_command(CLI::App& parent) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* command = parent.add_subcommand(
      "run", "Train from a recipe, under mpirun, srun, a torchrun-style environment, or standalone");
  command->add_option("recipe", options->recipe_path, "Recipe JSON file")->required();
  add_set_option(*command, options->overrides);
  command->add_option("--nproc-per-node", options->nproc_per_node,
                      "Without a launcher, start this many local workers (default 1)")
      ->check(positive_integer());
  command->add_option("--nnodes", options->nnodes,
                      "Hosts of the job, one `trainer run` per host (torchrun's; with MASTER_ADDR and MASTER_PORT "
                      "naming node 0)")
      ->check(positive_integer());
  command->add_option("--node-rank", options->node_rank, "This host's place among --nnodes (0 serves the rendezvous)");
  command->add_flag("--dry-run", options->dry_run, "Predict memory and step time (same as `trainer estimate`)");
  command->add_flag("--cpu", options->cpu, "Train on the CPU even when a GPU is present");
  command->add_flag("--force", options->force,
                    "Take checkpoint.dir over even when another job's claim on it looks alive");
  command->add_flag("--no-memory-check", options->no_memory_check,
                    "Start even when the estimated peak memory per rank exceeds what the device has");
  command->add_option("--max-restarts", options->max_restarts,
                      "Without a launcher: when a worker dies, fails or hangs, restart every worker from the newest "
                      "committed checkpoint, at most N times (default: checkpoint.max_restarts)")
      ->check(CLI::NonNegativeNumber);
  return [options] {
    // The workers get the same command line minus --nproc-per-node.
    options->argv = {"trainer", "run", options->recipe_path};
    for (const auto& o : options->overrides) {
      options->argv.push_back("--set");
      options->argv.push_back(o);
    }
    if (options->cpu) options->argv.push_back("--cpu");
    if (options->force) options->argv.push_back("--force");
    if (options->no_memory_check) options->argv.push_back("--no-memory-check");
    return run_training(*options);
  };
}

}  // namespace trainer::app
