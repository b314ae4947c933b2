#include "train/run_plan.h"

#include <utility>

#include "parallel/gpu_support.h"
#include "recipe/runtime_support.h"

namespace trainer::train {

RunPlan plan_run(const recipe::LoadedRecipe& loaded, const runtime::DeviceAssignment& device) {
  const recipe::MeshShape& mesh = loaded.mesh.value();
  RunPlan plan;
  plan.device = device;
  plan.pipeline = parallel::layout_pipeline(loaded.recipe, mesh);
  plan.support_problems = recipe::runtime_support_problems(loaded.recipe);
  if (device.on_gpu)
    for (auto& p : parallel::gpu_support_problems(loaded.recipe, mesh)) plan.support_problems.push_back(std::move(p));
  return plan;
}

}  // namespace trainer::train
