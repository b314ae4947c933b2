#include <fmt/format.h>

#include <cstdio>

#include "commands.h"
#include "core/error.h"

namespace trainer::app {

CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        size_t used = 0;
        long long value = 0;
        try {
          value = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != text.size() || value < 1) return "expected a positive integer, found \"" + text + "\"";
        return "";
      },
      "N>0");
}

void add_set_option(CLI::App& command, std::vector<std::string>& overrides) {
  command.add_option("--set", overrides, "Override a recipe value, KEY=VALUE (repeatable), e.g. --set training.steps=20")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false)  // one KEY=VALUE per --set; the recipe path may follow
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

}  // namespace trainer::app
