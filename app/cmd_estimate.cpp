// trainer estimate RECIPE [--set K=V]... [--world-size N] [--gpu NAME] [--gpu-profile FILE] [--cpu] [--json]
// The work is in lib/estimate/estimate_command.h, shared with `trainer run --dry-run`.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "estimate/estimate_command.h"

namespace trainer::app {

CommandAction add_estimate_command(CLI::App& parent) {
  auto options = std::make_shared<estimate::EstimateRequest>();
  CLI::App* command = parent.add_subcommand(
      "estimate", "Predict per-rank memory and step time for a recipe, without a GPU or a process group");
  command->add_option("recipe", options->recipe_path, "Recipe JSON file")->required();
  add_set_option(*command, options->overrides);
  command->add_option("--world-size", options->world_size,
                      "Number of GPUs (default: parallel.dp's, or the smallest valid mesh)")
      ->check(positive_integer());
  command->add_option("--gpu", options->gpu, "GPU profile (overrides hardware.gpu): h100-sxm, h100-pcie, h200, "
                                             "a100-80g, a100-40g, b200");
  command->add_option("--gpu-profile", options->gpu_profile,
                      "JSON file overriding fields of the GPU profile (format in docs/estimator.md)");
  command->add_flag("--cpu", options->cpu, "Predict the memory of `trainer run --cpu` instead (no step time)");
  command->add_flag("--fused-kernels", options->fused_kernels,
                    "Time memory-bound operations as fused kernels (Megatron/TE, torch.compile) would run them");
  command->add_flag("--json", options->json, "Machine-readable output (schema in docs/estimator.md)");
  return [options] { return estimate::run_estimate_command(*options, stdout); };
}

}  // namespace trainer::app
