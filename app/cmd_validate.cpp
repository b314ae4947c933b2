// trainer validate RECIPE [--set K=V]... [--world-size N] [--json]
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "mesh/rank_layout.h"
#include "recipe/load.h"

namespace trainer::app {

namespace {

struct ValidateOptions {
  std::string recipe_path;
  std::vector<std::string> overrides;
  int64_t world_size = 0;
  bool json = false;
};

// The hybrid-sharding groups only when the recipe asks for hybrid sharding (otherwise they are
// dp_cp and single ranks).
bool shown(mesh::GroupKind kind, const recipe::MeshShape& m) {
  return m.dp_shard > 0 || (kind != mesh::GroupKind::DpCpShard && kind != mesh::GroupKind::DpCpReplicate);
}

nlohmann::json mesh_json(const recipe::MeshShape& m) {
  nlohmann::json groups = nlohmann::json::object();
  const mesh::RankLayout layout(m);
  for (auto kind : mesh::all_group_kinds())
    if (shown(kind, m)) groups[mesh::group_kind_name(kind)] = layout.all_groups(kind);
  return {{"world_size", m.world_size}, {"tp", m.tp},   {"cp", m.cp},   {"dp", m.dp},
          {"pp", m.pp},                 {"vpp", m.vpp}, {"etp", m.etp}, {"ep", m.ep},
          {"edp", m.edp},               {"global_batch_size", m.global_batch_size},
          {"grad_accum_steps", m.grad_accum_steps}, {"groups", groups}};
}

// "dp (8 groups of 2): [0,4] [1,5] ..." per group kind; long lists are cut after a few groups.
std::string groups_text(const recipe::MeshShape& m) {
  const mesh::RankLayout layout(m);
  std::string text = "  groups (global ranks):\n";
  for (auto kind : mesh::all_group_kinds()) {
    if (!shown(kind, m)) continue;
    const auto groups = layout.all_groups(kind);
    text += fmt::format("    {:<10} {} x {}:", mesh::group_kind_name(kind), groups.size(),
                        groups.empty() ? 0 : groups.front().size());
    const size_t shown = std::min<size_t>(groups.size(), 8);
    for (size_t i = 0; i < shown; ++i) {
      std::string members;
      const size_t n = groups[i].size();
      for (size_t j = 0; j < std::min<size_t>(n, 16); ++j) {
        if (j) members += ',';
        members += std::to_string(groups[i][j]);
      }
      if (n > 16) members += ",...";
      text += " [" + members + "]";
    }
    if (groups.size() > shown) text += fmt::format(" ... ({} more)", groups.size() - shown);
    text += "\n";
  }
  return text;
}

std::string mesh_text(const recipe::MeshShape& m, int64_t micro_batch_size) {
  return fmt::format(
      "mesh for world size {} (rank order tp-cp-ep-dp-pp):\n"
      "  dense layers:  tp={} cp={} dp={} pp={} (vpp={})\n"
      "  expert layers: etp={} ep={} edp={} pp={}\n"
      "  global batch:  {} sequences = micro-batch {} x {} accumulation steps x dp {}\n",
      m.world_size, m.tp, m.cp, m.dp, m.pp, m.vpp, m.etp, m.ep, m.edp, m.pp, m.global_batch_size, micro_batch_size,
      m.grad_accum_steps, m.dp);
}

int run_validate(const ValidateOptions& options) {
  recipe::LoadOptions load;
  load.overrides = options.overrides;
  if (options.world_size > 0) load.world_size = options.world_size;
  const recipe::LoadedRecipe loaded = recipe::load_recipe(options.recipe_path, load);
  recipe::print_warnings(loaded, stderr);
  if (options.json) {
    nlohmann::json out = {{"recipe", loaded.resolved}, {"mesh", nullptr}};
    if (loaded.mesh) out["mesh"] = mesh_json(*loaded.mesh);
    std::fputs((out.dump(2) + "\n").c_str(), stdout);
    return 0;
  }
  // One format per mode: with a mesh, text mode prints the mesh (--json prints recipe and mesh as
  // one document); without one, the resolved recipe, which is JSON by nature.
  if (loaded.mesh)
    std::fputs((mesh_text(*loaded.mesh, loaded.recipe.training.micro_batch_size) + groups_text(*loaded.mesh)).c_str(),
               stdout);
  else
    std::fputs((loaded.resolved.dump(2) + "\n").c_str(), stdout);
  std::fflush(stdout);  // the verdict comes last, also when both streams go to one pipe
  std::fputs(fmt::format("{}: valid{}\n", options.recipe_path,
                         loaded.mesh ? fmt::format(" at world size {} (--json also prints the resolved recipe)",
                                                   loaded.mesh->world_size)
                                     : " (pass --world-size N to check the mesh and batch rules)")
                 .c_str(),
             stderr);
  return 0;
}

}  // namespace

CommandAction add_validate_command(CLI::App& parent) {
  auto options = std::make_shared<ValidateOptions>();
  CLI::App* command = parent.add_subcommand(
      "validate", "Resolve defaults, hf_config and overrides, check every rule, and print the resolved recipe");
  command->add_option("recipe", options->recipe_path, "Recipe JSON file")->required();
  add_set_option(*command, options->overrides);
  command->add_option("--world-size", options->world_size,
                      "Also check the rules that depend on the world size, and print the mesh")
      ->check(positive_integer());
  command->add_flag("--json", options->json, "Print {\"recipe\": ..., \"mesh\": ...} as one JSON document");
  return [options] { return run_validate(*options); };
}

}  // namespace trainer::app
