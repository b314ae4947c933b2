// trainer ckpt inspect DIR | trainer ckpt export DIR --hf OUT_DIR
#include <memory>

#include "commands.h"

namespace trainer::app {

namespace {
struct CkptOptions {
  std::string dir, hf_out;
};
}  // namespace

CommandAction add_ckpt_command(CLI::App& parent) {
  auto options = std::make_shared<CkptOptions>();
  CLI::App* command = parent.add_subcommand("ckpt", "Inspect or export checkpoints");
  command->require_subcommand(1);
  CLI::App* inspect = command->add_subcommand("inspect", "Print a checkpoint's step, mesh, tensors and sizes, and verify it");
  inspect->add_option("dir", options->dir, "Checkpoint directory")->required();
  CLI::App* export_hf = command->add_subcommand("export", "Write a checkpoint as Hugging Face config.json + safetensors");
  export_hf->add_option("dir", options->dir, "Checkpoint directory")->required();
  export_hf->add_option("--hf", options->hf_out, "Output directory")->required();
  return [inspect] {
    return not_available(inspect->parsed() ? "ckpt inspect" : "ckpt export",
                         "sharded checkpoints are delivered by their own work item");
  };
}

}  // namespace trainer::app
