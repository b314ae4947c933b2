#include "recipe/runtime_support.h"

#include <fmt/format.h>

#include <utility>

namespace trainer::recipe {

namespace {
// Calls unsupported(name, value) for each parallel setting this build cannot train.
template <typename F>
void for_each_unsupported(const Recipe& r, F&& unsupported) {
  const auto& p = r.parallel;
  // Expert parallelism: experts whole on each ep rank (etp 1), dense layers without tp (MoE under
  // tp needs sequence parallelism and expert tensor parallelism, not built yet).
  if (p.ep != 1 && (p.etp != 1 || p.tp != 1)) unsupported("ep", p.ep);
  // MoE under cp: the load-balancing statistics would cover only this rank's part of each sequence
  // (expert parallelism brings them over the whole batch).
  if (p.cp > 1 && r.model.moe) unsupported("cp", p.cp);
  if (r.model.moe && p.tp > 1) unsupported("tp", p.tp);  // MoE under tp arrives with expert parallelism
  if (!r.model.moe && p.etp != 1 && p.etp != p.tp) unsupported("etp", p.etp);
  if (p.zero > 1) unsupported("zero", p.zero);
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
    if (name == "zero")
      problems.push_back(fmt::format("parallel.zero={}: this build implements ZeRO stages 0 and 1; use zero 1", value));
    else if (name == "tp")
      problems.push_back(fmt::format("parallel.tp={} with model.moe: this build runs MoE layers without tensor "
                                     "parallelism only (tp 1); dense models take any tp", value));
    else if (name == "ep")
      problems.push_back(fmt::format("parallel.ep={}: this build runs expert parallelism with whole experts and "
                                     "without tensor parallelism (etp 1, tp 1)", value));
    else if (name == "cp")
      problems.push_back(fmt::format("parallel.cp={} with model.moe: this build runs MoE layers without context "
                                     "parallelism only (cp 1); dense models take any cp", value));
    else
      problems.push_back(fmt::format("parallel.{}={}: not supported by this build; `trainer validate` and the "
                                     "estimator accept it", name, value));
  });
  return problems;
}

}  // namespace trainer::recipe
