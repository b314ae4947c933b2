#include "estimate/estimate_command.h"

#include <fmt/format.h>

#include <numeric>

#include "core/error.h"
#include "estimate/estimate.h"
#include "estimate/report.h"
#include "recipe/mesh_shape.h"
#include "recipe/validate.h"

namespace trainer::estimate {

int64_t smallest_world_size(const recipe::Recipe& r) {
  const auto& p = r.parallel;
  int64_t world = p.tp * p.cp * p.pp;
  if (r.model.moe) world = std::lcm(world, p.etp * p.ep * p.pp);
  for (int64_t w = world; w <= (int64_t(1) << 24); w += world)
    if (recipe::validate_recipe(r, w).empty()) return w;
  return 0;
}

HardwareProfile resolve_profile(const recipe::Recipe& r, const std::string& gpu, const std::string& profile_file) {
  const std::string name = gpu.empty() ? r.hardware.gpu : gpu;
  if (!profile_file.empty()) return load_profile_file(profile_file, name);
  return builtin_profile(name);
}

int run_estimate_command(const EstimateRequest& request, std::FILE* out) {
  if (request.cpu && (!request.gpu.empty() || !request.gpu_profile.empty()))
    throw UserError("--cpu predicts `trainer run --cpu` and takes no GPU; drop --gpu/--gpu-profile or --cpu");
  recipe::LoadOptions load;
  load.overrides = request.overrides;
  if (!request.gpu.empty()) {
    builtin_profile(request.gpu);  // an unknown name fails here, listing the known ones
    load.overrides.push_back("hardware.gpu=" + request.gpu);
  }
  std::string note;
  if (request.world_size > 0) load.world_size = request.world_size;
  recipe::LoadedRecipe loaded = recipe::load_recipe(request.recipe_path, load);
  if (!loaded.mesh) {
    const int64_t world = smallest_world_size(loaded.recipe);
    if (world == 0)
      throw UserError(fmt::format("{}: no world size makes a valid mesh of this recipe; pass {} N",
                                  request.recipe_path, request.world_size_option));
    load.world_size = world;
    loaded = recipe::load_recipe(request.recipe_path, load);
    note = fmt::format("the smallest valid world size; pass {} N for another", request.world_size_option);
  }
  recipe::print_warnings(loaded, stderr);
  HardwareProfile gpu;
  if (!request.cpu) gpu = resolve_profile(loaded.recipe, request.gpu, request.gpu_profile);
  EstimateOptions options;
  options.fused_kernels = request.fused_kernels;
  const JobEstimate estimate = estimate_job(loaded.recipe, *loaded.mesh, request.cpu ? nullptr : &gpu, options);
  ReportContext context;
  context.recipe_path = request.recipe_path;
  context.recipe = &loaded.recipe;
  context.gpu = request.cpu ? nullptr : &gpu;
  context.fused_kernels = request.fused_kernels;
  context.world_size_note = note;
  if (request.json) {
    auto doc = estimate_json(estimate, context);
    doc["world_size_note"] = note.empty() ? nlohmann::json(nullptr) : nlohmann::json(note);
    std::fputs((doc.dump(2) + "\n").c_str(), out);
  } else {
    std::fputs(estimate_text(estimate, context).c_str(), out);
  }
  return 0;
}

}  // namespace trainer::estimate
