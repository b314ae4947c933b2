#include "recipe/runtime_support.h"

#include <fmt/format.h>

#include <utility>

namespace trainer::recipe {

bool runtime_supports(const Recipe& r) {
  const auto& p = r.parallel;
  return p.tp == 1 && p.pp == 1 && p.cp == 1 && p.ep == 1 && p.etp == 1 && p.zero <= 1;
}

std::vector<std::string> runtime_support_problems(const Recipe& r) {
  std::vector<std::string> problems;
  const auto& p = r.parallel;
  for (auto [name, value] : {std::pair{"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}, {"ep", p.ep}, {"etp", p.etp}})
    if (value != 1)
      problems.push_back(fmt::format("parallel.{}={}: this build trains with data parallelism only (tp, pp, cp, ep "
                                     "and etp must be 1); `trainer validate` and the estimator accept it",
                                     name, value));
  if (p.zero > 1)
    problems.push_back(fmt::format("parallel.zero={}: this build implements ZeRO stages 0 and 1; use zero 1", p.zero));
  return problems;
}

}  // namespace trainer::recipe
