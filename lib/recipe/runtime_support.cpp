#include "recipe/runtime_support.h"

#include <fmt/format.h>

#include <utility>

namespace trainer::recipe {

namespace {
// Calls unsupported(name, value) for each parallel setting this build cannot train.
template <typename F>
void for_each_unsupported(const Recipe& r, F&& unsupported) {
  const auto& p = r.parallel;
  // Without experts etp means nothing: only its default (tp) or 1.
  if (!r.model.moe && p.etp != 1 && p.etp != p.tp) unsupported("etp", p.etp);
  // Hybrid sharding covers dense weights; expert weights would need their own shard groups.
  if (r.model.moe && p.dp_shard != -1) unsupported("dp_shard", p.dp_shard);
}
}  // namespace

bool runtime_supports(const Recipe& r) {
  bool supported = true;
  for_each_unsupported(r, [&](const char*, int64_t) { supported = false; });
  return supported;
}

std::vector<std::string> runtime_support_problems(const Recipe& r) {
  std::vector<std::string> problems;
  for_each_unsupported(r, [&](const std::string& name, int64_t value) {
    if (name == "dp_shard")
      problems.push_back(fmt::format("parallel.dp_shard={}: hybrid sharding is implemented for dense models (expert "
                                     "weights would need shard groups of their own); use dp_shard -1", value));
    else
      problems.push_back(fmt::format("parallel.{}={}: not supported by this build; `trainer validate` and the "
                                     "estimator accept it", name, value));
  });
  return problems;
}

}  // namespace trainer::recipe
