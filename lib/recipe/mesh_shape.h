#pragma once
// The sizes of the 5-D mesh a recipe implies at a given world size (DESIGN.md section 6):
// dense layers use tp x cp x dp x pp, expert layers etp x ep x edp x pp over the same ranks.
// Pure arithmetic; the rank-to-group math lives in lib/mesh.
#include <cstdint>
#include <string>

#include "recipe/recipe.h"

namespace trainer::recipe {

struct MeshShape {
  int64_t world_size = 1;
  int64_t tp = 1, cp = 1, dp = 1, pp = 1, vpp = 1;
  int64_t etp = 1, ep = 1, edp = 1;
  int64_t dp_shard = 0;  // hybrid sharding: data-parallel ranks per ZeRO shard group; 0: all of dp
  int64_t shard_dp() const { return dp_shard > 0 ? dp_shard : dp; }
  int64_t global_batch_size = 1;
  int64_t grad_accum_steps = 1;  // micro-batches per rank per optimizer step
};

// The mesh for `world_size` ranks. Precondition: the recipe passed validation at that world size
// (see validate_recipe), so every division is exact.
MeshShape mesh_shape(const Recipe& recipe, int64_t world_size);

// The world size a recipe fixes by itself (parallel.dp given), or 0 when it leaves dp derived.
int64_t implied_world_size(const Recipe& recipe);

}  // namespace trainer::recipe
