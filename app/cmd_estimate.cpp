// trainer estimate RECIPE [--set K=V]... [--world-size N] [--gpu NAME] [--json]
#include <memory>

#include "commands.h"

namespace trainer::app {

namespace {
struct EstimateOptions {
  std::string recipe_path, gpu;
  std::vector<std::string> overrides;
  int64_t world_size = 0;
  bool json = false;
};
}  // namespace

CommandAction add_estimate_command(CLI::App& parent) {
  auto options = std::make_shared<EstimateOptions>();
  CLI::App* command = parent.add_subcommand(
      "estimate", "Predict per-rank memory and step time for a recipe, without a GPU or a process group");
  command->add_option("recipe", options->recipe_path, "Recipe JSON file")->required();
  add_set_option(*command, options->overrides);
  command->add_option("--world-size", options->world_size, "Number of GPUs")->check(CLI::PositiveNumber);
  command->add_option("--gpu", options->gpu, "GPU profile (overrides hardware.gpu)");
  command->add_flag("--json", options->json, "Machine-readable output");
  return [] { return not_available("estimate", "the memory and time estimator is delivered by its own work item"); };
}

}  // namespace trainer::app
