// trainer run RECIPE [--set K=V]... [--nproc-per-node N] [--dry-run]
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "recipe/load.h"
#include "runtime/stop_signal.h"
#include "train/trainer.h"

namespace trainer::app {

namespace {

struct RunOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc_per_node = 1;
  bool dry_run = false;
  bool cpu = false;
};

int run_training(const RunOptions& options) {
  if (options.dry_run)
    return not_available("run --dry-run", "the memory and time estimator is delivered by its own work item");
  if (options.nproc_per_node > 1)
    return not_available("run --nproc-per-node", "multi-process training arrives with the distributed runtime");
  recipe::LoadOptions load;
  load.overrides = options.overrides;
  load.world_size = 1;
  const recipe::LoadedRecipe loaded = recipe::load_recipe(options.recipe_path, load);
  runtime::StopSignal::install();
  train::TrainOptions train_options;
  train_options.force_cpu = options.cpu;
  const train::TrainSummary summary = train::train(loaded, train_options);
  std::printf("%s after step %lld of %lld; last loss %.4f%s\n",
              summary.stopped_by_signal ? "stopped" : "finished", (long long)summary.steps_completed,
              (long long)loaded.recipe.training.steps, summary.last_loss,
              summary.last_checkpoint.empty() ? "" : fmt::format("; checkpoint {}", summary.last_checkpoint).c_str());
  return 0;
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
      ->check(CLI::PositiveNumber);
  command->add_flag("--dry-run", options->dry_run, "Predict memory and step time (same as `trainer estimate`)");
  command->add_flag("--cpu", options->cpu, "Train on the CPU even when a GPU is present");
  return [options] { return run_training(*options); };
}

}  // namespace trainer::app
