// trainer plan RECIPE --gpus N [--gpu NAME] [--top K] [--json]
#include <memory>

#include "commands.h"

namespace trainer::app {

namespace {
struct PlanOptions {
  std::string recipe_path, gpu;
  std::vector<std::string> overrides;
  int64_t gpus = 0;
  int top = 10;
  bool json = false;
};
}  // namespace

CommandAction add_plan_command(CLI::App& parent) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command = parent.add_subcommand(
      "plan", "Search tp/pp/cp/ep/dp, micro-batch, recompute and ZeRO for the fastest configuration that fits");
  command->add_option("recipe", options->recipe_path, "Recipe JSON file")->required();
  add_set_option(*command, options->overrides);
  command->add_option("--gpus", options->gpus, "Number of GPUs")->required()->check(CLI::PositiveNumber);
  command->add_option("--gpu", options->gpu, "GPU profile (overrides hardware.gpu)");
  command->add_option("--top", options->top, "How many configurations to print (default 10)")->check(CLI::PositiveNumber);
  command->add_flag("--json", options->json, "Machine-readable output");
  return [] { return not_available("plan", "the configuration search is delivered with the estimator"); };
}

}  // namespace trainer::app
