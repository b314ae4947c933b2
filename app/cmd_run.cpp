// trainer run RECIPE [--set K=V]... [--nproc-per-node N] [--dry-run]
#include <memory>

#include "commands.h"

namespace trainer::app {

namespace {
struct RunOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  int nproc_per_node = 1;
  bool dry_run = false;
};
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
  return [] {
    return not_available("run", "training arrives with the single-process training work; `trainer validate RECIPE` checks a recipe now");
  };
}

}  // namespace trainer::app
