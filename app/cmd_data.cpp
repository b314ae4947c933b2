// trainer data inspect PATH... [--format F] [--seq-len N] [--vocab-size N] [--json]
//                             [--lengths [--separator ID] [--dp N --micro-batches N --micro-batch-size N]]
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "data/document_lengths.h"
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
  // --lengths: the document-length distribution and, with --seq-len, the predicted balance.
  bool lengths = false;
  std::optional<int64_t> separator;
  int64_t dp = 8, micro_batches = 8, micro_batch_size = 1, batches = 64;
};

// The distribution of `lengths`: count, mean, percentiles, and a histogram by powers of two.
nlohmann::json length_summary(std::vector<int64_t> lengths) {
  std::sort(lengths.begin(), lengths.end());
  // Nearest-rank percentiles.
  const size_t n = lengths.size();
  const auto percentile = [&](double p) {
    return lengths[std::clamp<size_t>(size_t(std::ceil(p / 100.0 * double(n))), 1, n) - 1];
  };
  double sum = 0;
  for (const int64_t l : lengths) sum += double(l);
  nlohmann::json buckets = nlohmann::json::array();  // [low, high) token lengths and document count
  for (int64_t low = 1; low <= lengths.back(); low *= 2) {
    const auto first = std::lower_bound(lengths.begin(), lengths.end(), low);
    const auto last = std::lower_bound(lengths.begin(), lengths.end(), low * 2);
    buckets.push_back({{"from", low}, {"below", low * 2}, {"documents", int64_t(last - first)}});
  }
  return {{"documents", lengths.size()},
          {"mean", sum / double(lengths.size())},
          {"p10", percentile(10)},
          {"p50", percentile(50)},
          {"p90", percentile(90)},
          {"p99", percentile(99)},
          {"max", lengths.back()},
          {"histogram", buckets}};
}

void print_lengths(const nlohmann::json& d) {
  std::printf("  document lengths: %s documents, mean %.1f, p10 %s, median %s, p90 %s, p99 %s, max %s tokens\n",
              d["documents"].dump().c_str(), d["mean"].get<double>(), d["p10"].dump().c_str(), d["p50"].dump().c_str(),
              d["p90"].dump().c_str(), d["p99"].dump().c_str(), d["max"].dump().c_str());
  std::printf("  for trainer estimate with document masking: data.document_length_median=%s "
              "data.document_length_p99=%s\n",
              d["p50"].dump().c_str(), d["p99"].dump().c_str());
  int64_t most = 1;
  for (const auto& b : d["histogram"]) most = std::max(most, b["documents"].get<int64_t>());
  for (const auto& b : d["histogram"]) {
    const int64_t n = b["documents"].get<int64_t>();
    const int bar = int(std::ceil(40.0 * double(n) / double(most)));
    std::printf("  %8lld - %-8lld %10lld %s\n", (long long)b["from"].get<int64_t>(),
                (long long)(b["below"].get<int64_t>() - 1), (long long)n, std::string(size_t(n > 0 ? bar : 0), '#').c_str());
  }
}

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
    if (options.lengths) {
      if (!options.separator && !source->documents())
        throw UserError(fmt::format("{}: the {} format records no document boundaries; give --separator ID, the "
                                    "token that ends each document",
                                    path, source->format()));
      const std::vector<int64_t> lengths = data::document_lengths(*source, options.separator);
      if (lengths.empty()) throw UserError(fmt::format("{}: no tokens, no documents", path));
      item["lengths"] = length_summary(lengths);
      if (options.seq_len > 0 && data::window_count(source->token_count(), options.seq_len) > 0) {
        const auto work = data::window_attention_work(lengths, options.seq_len);
        const auto p = data::predict_balance(work, options.seq_len, options.dp, options.micro_batches,
                                             options.micro_batch_size, options.batches, /*seed=*/1234);
        item["balance"] = {{"dp", options.dp},
                           {"micro_batches", options.micro_batches},
                           {"micro_batch_size", options.micro_batch_size},
                           {"global_batches", p.global_batches},
                           {"attention_work_fraction", p.attention_fraction},
                           {"max_over_mean_none", p.contiguous},
                           {"max_over_mean_cost", p.balanced}};
      }
    }
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
    if (item.contains("lengths")) print_lengths(item["lengths"]);
    if (item.contains("balance")) {
      const auto& b = item["balance"];
      std::printf("  with document masking at seq_len %lld: attention work %.3f of full causal attention; slowest "
                  "rank's attention work over the mean (dp %s x %s micro-batches of %s, %s global batches): %.3f "
                  "with data.balance \"none\", %.3f with \"cost\"\n",
                  (long long)options.seq_len, b["attention_work_fraction"].get<double>(), b["dp"].dump().c_str(),
                  b["micro_batches"].dump().c_str(), b["micro_batch_size"].dump().c_str(),
                  b["global_batches"].dump().c_str(), b["max_over_mean_none"].get<double>(),
                  b["max_over_mean_cost"].get<double>());
    }
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
  inspect_cmd->add_flag("--lengths", options->lengths,
                        "Also the document-length distribution (percentiles, a histogram) and, with --seq-len, the "
                        "attention work under document masking and the predicted balance across ranks");
  inspect_cmd->add_option("--separator", options->separator,
                          "With --lengths: documents end after this token (data.document_separator_token); "
                          "default: the files' document index")
      ->check(CLI::NonNegativeNumber);
  inspect_cmd->add_option("--dp", options->dp, "With --lengths --seq-len: data-parallel ranks (default 8)")
      ->check(positive_integer());
  inspect_cmd->add_option("--micro-batches", options->micro_batches,
                          "With --lengths --seq-len: micro-batches per rank and step (default 8)")
      ->check(positive_integer());
  inspect_cmd->add_option("--micro-batch-size", options->micro_batch_size,
                          "With --lengths --seq-len: samples per micro-batch (default 1)")
      ->check(positive_integer());
  inspect_cmd->add_option("--batches", options->batches,
                          "With --lengths --seq-len: global batches to simulate (default 64)")
      ->check(positive_integer());
  return [options] { return inspect(*options); };
}

}  // namespace trainer::app
