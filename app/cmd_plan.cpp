// trainer plan RECIPE --gpus N [--set K=V]... [--gpu NAME] [--gpu-profile FILE] [--top K] [--memory-margin F] [--json]
#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/error.h"
#include "estimate/estimate_command.h"
#include "estimate/plan.h"
#include "recipe/load.h"

namespace trainer::app {

namespace {

struct PlanOptions {
  std::string recipe_path, gpu, gpu_profile;
  std::vector<std::string> overrides;
  int64_t gpus = 0;
  int64_t top = 10;
  double margin = 0.05;
  bool all = false;
  bool json = false;
};

int run_plan(const PlanOptions& options) {
  recipe::LoadOptions load;
  load.overrides = options.overrides;
  if (!options.gpu.empty()) {
    estimate::builtin_profile(options.gpu);  // an unknown name fails here, listing the known ones
    load.overrides.push_back("hardware.gpu=" + options.gpu);
  }
  const recipe::LoadedRecipe loaded = recipe::load_recipe(options.recipe_path, load);
  recipe::print_warnings(loaded, stderr);
  const estimate::HardwareProfile gpu = estimate::resolve_profile(loaded.recipe, options.gpu, options.gpu_profile);
  estimate::PlanOptions plan;
  plan.gpus = options.gpus;
  plan.top = options.top;
  plan.memory_margin = options.margin;
  plan.runnable_only = !options.all;
  const estimate::PlanResult result = estimate::plan_search(loaded.recipe, gpu, plan);
  if (options.json)
    std::fputs((estimate::plan_json(result, gpu, plan, options.recipe_path).dump(2) + "\n").c_str(), stdout);
  else
    std::fputs(estimate::plan_text(result, gpu, plan, options.recipe_path).c_str(), stdout);
  return 0;
}

}  // namespace

CommandAction add_plan_command(CLI::App& parent) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command = parent.add_subcommand(
      "plan", "Search tp/pp/cp/ep/dp, micro-batch, recompute and ZeRO for the fastest configuration that fits");
  command->add_option("recipe", options->recipe_path, "Recipe JSON file")->required();
  add_set_option(*command, options->overrides);
  command->add_option("--gpus", options->gpus, "Number of GPUs")->required()->check(positive_integer());
  command->add_option("--gpu", options->gpu, "GPU profile (overrides hardware.gpu)");
  command->add_option("--gpu-profile", options->gpu_profile, "JSON file overriding fields of the GPU profile");
  command->add_option("--top", options->top, "How many configurations to print (default 10)")->check(positive_integer());
  command->add_option("--memory-margin", options->margin,
                      "Fraction of device memory kept free (default 0.05: use at most 95%)")
      ->check(CLI::Range(0.0, 0.9));
  command->add_flag("--all", options->all,
                    "Also rank layouts `trainer run` refuses on GPUs. The search varies only what runs there (cp "
                    "with Ulysses, interleaving when pp divides the micro-batches), so these come from the recipe's "
                    "own settings, such as parallel.dp_shard in an MoE model");
  command->add_flag("--json", options->json, "Machine-readable output (schema in docs/estimator.md)");
  return [options] { return run_plan(*options); };
}

}  // namespace trainer::app
