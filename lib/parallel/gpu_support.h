#pragma once
// What this build cannot run on GPUs although it runs on the CPU, in one place: `run` refuses it
// before any process group or GPU is touched when its workers will use CUDA, and `plan` (which
// plans for GPUs) proposes only what passes. Torch-free.
#include <string>
#include <vector>

#include "recipe/mesh_shape.h"
#include "recipe/recipe.h"

namespace trainer::parallel {

// One message per setting (naming the field and what to use instead); empty when the recipe runs
// on GPUs at this mesh.
std::vector<std::string> gpu_support_problems(const recipe::Recipe& recipe, const recipe::MeshShape& mesh);

}  // namespace trainer::parallel
