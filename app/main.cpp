// trainer: one binary for training, validating, estimating and planning. Every error is caught
// here once: user errors exit 2, internal failures exit 1 (DESIGN.md section 8).
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/error.h"
#include "runtime/build_info.h"

namespace {

int run_main(int argc, char** argv) {
  CLI::App app{"trainer: train Llama- and Mixtral-style language models on many GPUs from one JSON recipe.",
               "trainer"};
  app.require_subcommand(0, 1);
  app.fallthrough(false);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version, git commit, libtorch version, and CUDA/NCCL availability");

  std::vector<std::pair<CLI::App*, trainer::app::CommandAction>> commands;
  auto remember = [&](trainer::app::CommandAction action) { commands.emplace_back(app.get_subcommands({}).back(), action); };
  remember(trainer::app::add_run_command(app));
  remember(trainer::app::add_validate_command(app));
  remember(trainer::app::add_estimate_command(app));
  remember(trainer::app::add_plan_command(app));
  remember(trainer::app::add_ckpt_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints help, exit 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message
    return trainer::kExitUsageError;
  }
  if (show_version) {
    std::fputs(trainer::runtime::format_build_info(trainer::runtime::build_info()).c_str(), stdout);
    return trainer::kExitOk;
  }
  for (auto& [command, action] : commands)
    if (command->parsed()) return action();
  std::fputs(app.help().c_str(), stderr);
  std::fputs("error: a subcommand is required\n", stderr);
  return trainer::kExitUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const trainer::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return trainer::kExitUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return trainer::kExitRuntimeFailure;
  } catch (...) {
    std::fprintf(stderr, "internal error: unknown exception\n");
    return trainer::kExitRuntimeFailure;
  }
}
