// trainer: one binary for training, validating, estimating and planning. Every error is caught
// here once: user errors exit 2, internal failures exit 1 (DESIGN.md section 8).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "failure_report.h"
#include "core/error.h"
#include "recipe/schema.h"
#include "runtime/build_info.h"
#include "runtime/rendezvous.h"
#include "runtime/stop_signal.h"

namespace {

// "--steps 10" and the like: CLI11 says "arguments were not expected: 10 --steps" (in reverse).
// Say which arguments, and when one names a recipe key, the --set that was meant.
void report_extra_arguments(const std::string& message) {
  const auto colon = message.find(": ");
  std::vector<std::string> extras;
  if (colon != std::string::npos) {
    std::istringstream words(message.substr(colon + 2));
    for (std::string word; words >> word;) extras.insert(extras.begin(), word);
  }
  std::string hint;
  for (size_t i = 0; i < extras.size() && hint.empty(); ++i) {
    if (extras[i].rfind("--", 0) != 0) continue;
    const std::string name = extras[i].substr(2);
    for (const auto& spec : trainer::recipe::schema()) {
      const auto dot = spec.path.rfind('.');
      if (spec.path.substr(dot == std::string::npos ? 0 : dot + 1) != name) continue;
      const std::string value = i + 1 < extras.size() ? extras[i + 1] : "VALUE";
      hint = fmt::format("; recipe values are set with --set, e.g. --set {}={}", spec.path, value);
      break;
    }
  }
  std::string joined;
  for (const auto& e : extras) joined += (joined.empty() ? "" : " ") + e;
  std::fprintf(stderr, "error: unexpected argument%s: %s%s (see --help)\n", extras.size() == 1 ? "" : "s",
               joined.c_str(), hint.c_str());
}

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
  remember(trainer::app::add_schedule_command(app));
  remember(trainer::app::add_ckpt_command(app));
  remember(trainer::app::add_data_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints help, exit 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    report_extra_arguments(e.what());
    return trainer::kExitUsageError;
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

// Every error, caught once.
int guarded_main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (...) {
    return trainer::app::report_failure();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int code = guarded_main(argc, argv);
  if (trainer::runtime::rendezvous_abandoned()) {
    // A thread is still inside c10d's connect loop: leave without static destructors.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}
