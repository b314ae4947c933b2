#include "recipe/mesh_shape.h"

namespace trainer::recipe {

int64_t implied_world_size(const Recipe& recipe) {
  const auto& p = recipe.parallel;
  return p.dp > 0 ? p.tp * p.cp * p.dp * p.pp : 0;
}

MeshShape mesh_shape(const Recipe& recipe, int64_t world_size) {
  const auto& p = recipe.parallel;
  MeshShape m;
  m.world_size = world_size;
  m.tp = p.tp;
  m.cp = p.cp;
  m.pp = p.pp;
  m.vpp = p.vpp;
  m.dp = world_size / (p.tp * p.cp * p.pp);
  m.dp_shard = p.dp_shard > 0 && p.dp_shard < m.dp ? p.dp_shard : 0;
  m.etp = p.etp;
  m.ep = p.ep;
  m.edp = world_size / (p.etp * p.ep * p.pp);
  const auto& t = recipe.training;
  m.global_batch_size = t.global_batch_size.value_or(t.micro_batch_size * m.dp);
  m.grad_accum_steps = m.global_batch_size / (t.micro_batch_size * m.dp);
  return m;
}

}  // namespace trainer::recipe
