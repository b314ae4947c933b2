#pragma once
// `trainer estimate` (and `trainer run --dry-run`): load and check a recipe, pick the GPU
// profile, estimate, print. Torch-free: no GPU, no process group, a few milliseconds.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "estimate/hardware.h"
#include "recipe/load.h"

namespace trainer::estimate {

struct EstimateRequest {
  std::string recipe_path;
  std::vector<std::string> overrides;  // --set KEY=VALUE
  int64_t world_size = 0;              // 0: fixed by parallel.dp, else the smallest mesh the recipe allows
  std::string gpu;                     // --gpu NAME (a built-in profile); "": hardware.gpu
  std::string gpu_profile;             // --gpu-profile FILE: overrides fields of that profile
  bool cpu = false;                    // predict `trainer run --cpu`: memory only
  bool json = false;
  bool fused_kernels = false;          // --fused-kernels: time with fused memory-bound kernels
  std::string world_size_option = "--world-size";  // how hints name the world size (run: --nproc-per-node)
};

// The smallest world size at which `recipe` (dp left at -1) is a valid mesh: a multiple of
// tp*cp*pp and of etp*ep*pp; 0 when none up to 2^24 is.
int64_t smallest_world_size(const recipe::Recipe& recipe);

// The GPU profile a recipe asks for: `gpu` or hardware.gpu, with `profile_file`'s fields on top.
// Throws UserError for an unknown name or an invalid file.
HardwareProfile resolve_profile(const recipe::Recipe& recipe, const std::string& gpu, const std::string& profile_file);

// Runs the command and prints to `out`. Throws UserError (exit code 2) for recipe, option and
// profile problems; returns the exit code otherwise (0).
int run_estimate_command(const EstimateRequest& request, std::FILE* out);

}  // namespace trainer::estimate
