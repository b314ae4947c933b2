#include "recipe/runtime_support.h"

#include <fmt/format.h>

#include <utility>

namespace trainer::recipe {

namespace {
// Calls unsupported(name, value) for each parallel setting this build cannot train.
template <typename F>
void for_each_unsupported(const Recipe& r, F&& unsupported) {
  const auto& p = r.parallel;
  for (auto [name, value] : {std::pair{"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}, {"ep", p.ep}, {"etp", p.etp}})
    if (value != 1) unsupported(name, value);
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
    problems.push_back(name == "zero"
                           ? fmt::format("parallel.zero={}: this build implements ZeRO stages 0 and 1; use zero 1", value)
                           : fmt::format("parallel.{}={}: this build trains with data parallelism only (tp, pp, cp, "
                                         "ep and etp must be 1); `trainer validate` and the estimator accept it",
                                         name, value));
  });
  return problems;
}

}  // namespace trainer::recipe
