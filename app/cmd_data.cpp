// trainer data inspect PATH... [--format F] [--seq-len N] [--vocab-size N] [--json]
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <limits>
#include <memory>

#include "commands.h"
#include "data/token_dataset.h"
#include "data/token_source.h"

namespace trainer::app {

namespace {

struct DataOptions {
  std::vector<std::string> paths;
  std::string format = "auto";
  int64_t seq_len = 0;
  int64_t vocab_size = std::numeric_limits<int32_t>::max();
  bool json = false;
};

// Opens every path as training would (the same validation) and prints what it holds.
int inspect(const DataOptions& options) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& path : options.paths) {
    const auto source =
        data::open_token_source(path, *recipe::enum_from_name<recipe::DataFormat>(options.format), options.vocab_size);
    nlohmann::json item = {{"path", path},
                           {"format", source->format()},
                           {"tokens", source->token_count()},
                           {"documents", source->documents() ? nlohmann::json(*source->documents()) : nullptr},
                           {"token_type", source->token_type()},
                           {"max_token_id", source->max_token_id()}};
    if (options.seq_len > 0)
      item["samples"] = {{"seq_len", options.seq_len},
                         {"count", data::window_count(source->token_count(), options.seq_len)}};
    all.push_back(item);
  }
  if (options.json) {
    std::fputs((all.dump(2) + "\n").c_str(), stdout);
    return 0;
  }
  for (const auto& item : all) {
    std::printf("%s: %s format, %s tokens (%s), %s, largest token id %s%s\n",
                item["path"].get<std::string>().c_str(), item["format"].get<std::string>().c_str(),
                item["tokens"].dump().c_str(), item["token_type"].get<std::string>().c_str(),
                item["documents"].is_null() ? "documents not recorded"
                                            : fmt::format("{} documents", item["documents"].dump()).c_str(),
                item["max_token_id"].dump().c_str(),
                item.contains("samples") ? fmt::format("; {} samples of seq_len {}", item["samples"]["count"].dump(),
                                                       options.seq_len)
                                               .c_str()
                                         : "");
  }
  return 0;
}

}  // namespace

CommandAction add_data_command(CLI::App& parent) {
  auto options = std::make_shared<DataOptions>();
  CLI::App* command = parent.add_subcommand("data", "Inspect token datasets");
  command->require_subcommand(1);
  CLI::App* inspect_cmd = command->add_subcommand(
      "inspect", "Print the format, token and document counts, token type, largest id and sample count of token "
                 "datasets (trainer, Megatron-LM or llm.c), validating them as training does");
  inspect_cmd->add_option("paths", options->paths, "Prefixes, files or globs, as in data.paths")->required();
  inspect_cmd->add_option("--format", options->format, "auto (default), trainer, megatron or llmc")
      ->check(CLI::IsMember(recipe::enum_names<recipe::DataFormat>()));
  inspect_cmd->add_option("--seq-len", options->seq_len, "Also count the samples of this sequence length")
      ->check(positive_integer());
  inspect_cmd->add_option("--vocab-size", options->vocab_size, "Check every token id is below this (default: none)")
      ->check(positive_integer());
  inspect_cmd->add_flag("--json", options->json, "One JSON array, an object per path");
  return [options] { return inspect(*options); };
}

}  // namespace trainer::app
