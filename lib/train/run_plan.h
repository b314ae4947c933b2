#pragma once
// What this run will do, decided once before anything starts: this worker's device and backend,
// the pipeline layout (which layers every stage holds: the one the estimator uses too), and the
// settings this build cannot run there. `trainer run` builds it in its pre-flight (the launcher's
// check before starting workers, and each worker's before any process group) and hands it to
// train(), which reads it rather than deciding again.
#include <string>
#include <vector>

#include "parallel/pipeline/pipeline_layout.h"
#include "recipe/load.h"
#include "runtime/device_assignment.h"

namespace trainer::train {

struct RunPlan {
  runtime::DeviceAssignment device;  // runtime::assign_device's answer; the default is the CPU
  parallel::PipelineLayout pipeline;
  // One message per setting this build cannot run (recipe::runtime_support_problems, and
  // parallel::gpu_support_problems when the device is a GPU), naming the field; empty to go.
  std::vector<std::string> support_problems;
};

// The plan of a loaded recipe (resolved at the job's world size) on `device`.
RunPlan plan_run(const recipe::LoadedRecipe& loaded, const runtime::DeviceAssignment& device);

}  // namespace trainer::train
