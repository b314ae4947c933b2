// trainer ckpt inspect DIR | trainer ckpt export DIR --hf OUT_DIR
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/dir_claim.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/manifest_check.h"
#include "commands.h"
#include "core/error.h"
#include "metrics/human_format.h"

namespace trainer::app {

namespace {

struct CkptOptions {
  std::string dir, hf_out;
};

// Checks the checkpoint as a resume reads it (every manifest field, every file's size and CRC-32,
// every record against its file, the optimizer state of every parameter) and prints what it holds.
int inspect(const CkptOptions& options) {
  const checkpoint::LoadedCheckpoint loaded(options.dir);
  const auto& m = loaded.manifest();
  const auto missing = checkpoint::missing_training_state(m);
  if (!missing.empty())
    throw UserError(fmt::format("{}/manifest.json: tensors: no {}{}: a resume from this checkpoint fails (it needs every "
                                "parameter with its optimizer state and step count, and its fp32 master weights unless it "
                                "is stored in fp32)",
                                loaded.path(), missing.front(),
                                missing.size() > 1 ? fmt::format(" (and {} more tensors)", missing.size() - 1) : ""));
  std::printf("checkpoint %s\n", loaded.path().c_str());
  std::printf("  step %lld, %lld samples consumed, format version %d\n", (long long)loaded.step(),
              (long long)loaded.consumed_samples(), m.value("version", 0));
  std::printf("  mesh %s\n", m.value("mesh", nlohmann::json::object()).dump().c_str());
  // The directory's claim (dir_claim.h): which job, if any, is writing checkpoints here.
  const std::filesystem::path step_dir(loaded.path());
  std::optional<checkpoint::ClaimStatus> claim;
  for (const auto& dir : {std::filesystem::path(options.dir), step_dir.parent_path()})
    if (!claim) claim = checkpoint::read_claim(dir.string());
  if (!claim)
    std::printf("  claim: none (no job is writing to this directory)\n");
  else
    std::printf("  claim: %s: %s (%s)\n", claim->describe().c_str(),
                claim->live ? "live" : "not live, the next job takes it over", claim->why.c_str());
  int64_t total = 0, count = 0;
  std::printf("  %-64s %-9s %s\n", "tensor", "dtype", "global shape");
  for (const auto& [name, record] : m.at("tensors").items()) {
    std::printf("  %-64s %-9s %s\n", name.c_str(), record.at("dtype").get<std::string>().c_str(),
                record.at("global_shape").dump().c_str());
    ++count;
  }
  for (const auto& file : m.at("files")) total += file.at("bytes").get<int64_t>();
  std::printf("  %lld tensors in %zu file(s), %s; the manifest's records, every file's size and CRC-32 verified\n",
              (long long)count, m.at("files").size(), metrics::format_bytes(total).c_str());
  return 0;
}

}  // namespace

CommandAction add_ckpt_command(CLI::App& parent) {
  auto options = std::make_shared<CkptOptions>();
  CLI::App* command = parent.add_subcommand("ckpt", "Inspect or export checkpoints");
  command->require_subcommand(1);
  CLI::App* inspect_cmd =
      command->add_subcommand("inspect", "Print a checkpoint's step, mesh, tensors and sizes, and verify it");
  inspect_cmd->add_option("dir", options->dir, "A step directory, or a checkpoint directory (its latest)")->required();
  CLI::App* export_hf = command->add_subcommand("export", "Write a checkpoint as Hugging Face config.json + safetensors");
  export_hf->add_option("dir", options->dir, "Checkpoint directory")->required();
  export_hf->add_option("--hf", options->hf_out, "Output directory")->required();
  return [inspect_cmd, options] {
    if (inspect_cmd->parsed()) return inspect(*options);
    const checkpoint::LoadedCheckpoint loaded(options->dir);
    const int files = checkpoint::export_hf(loaded, options->hf_out);
    std::printf("exported step %lld of %s to %s: config.json and %d safetensors file(s)\n", (long long)loaded.step(),
                loaded.path().c_str(), options->hf_out.c_str(), files);
    return 0;
  };
}

}  // namespace trainer::app
