#pragma once
// The subcommands of `trainer`. Each add_* registers its options on the parent app and returns
// the function to call when that subcommand was chosen; it returns the process exit code.
#include <CLI/CLI.hpp>
#include <functional>

namespace trainer::app {

using CommandAction = std::function<int()>;

CommandAction add_run_command(CLI::App& parent);
CommandAction add_validate_command(CLI::App& parent);
CommandAction add_estimate_command(CLI::App& parent);
CommandAction add_plan_command(CLI::App& parent);
CommandAction add_schedule_command(CLI::App& parent);
CommandAction add_ckpt_command(CLI::App& parent);
CommandAction add_data_command(CLI::App& parent);

// A check for counts (world size, GPUs, workers): "--gpus 0: expected a positive integer".
CLI::Validator positive_integer();

// --set KEY=VALUE, repeatable; shared by the subcommands that read a recipe.
void add_set_option(CLI::App& command, std::vector<std::string>& overrides);

}  // namespace trainer::app
