#pragma once
// What this build's `trainer run` can train, in one place: `run` refuses the rest before anything
// starts, and `plan` proposes only what `run` accepts. Shrinks as the parallel dimensions land.
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace trainer::recipe {

// One message per setting this build cannot run yet ("parallel.tp=2: ..."); empty when it can.
std::vector<std::string> runtime_support_problems(const Recipe& recipe);

// runtime_support_problems(recipe).empty(), without building messages (plan asks it per candidate).
bool runtime_supports(const Recipe& recipe);

}  // namespace trainer::recipe
