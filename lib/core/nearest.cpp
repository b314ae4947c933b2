#include "core/nearest.h"

#include <algorithm>
#include <cctype>

namespace trainer {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string nearest_candidate(const std::string& word, const std::vector<std::string>& candidates) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string lowered = lower(word);
  // A word that begins a candidate is an abbreviation of it ("h100" for "h100-sxm"), however far
  // the edit distance; the shortest such candidate is meant.
  std::string prefixed;
  for (const auto& candidate : candidates)
    if (!lowered.empty() && lower(candidate).rfind(lowered, 0) == 0 && lowered != lower(candidate) &&
        (prefixed.empty() || candidate.size() < prefixed.size()))
      prefixed = candidate;
  if (!prefixed.empty()) return prefixed;
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& candidate : candidates) {
    // Case differences are cheap: "TP" for "tp" is an obvious match.
    const size_t distance = edit_distance(lowered, lower(candidate));
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  const size_t allowed = std::max<size_t>(2, (word.size() + 2) / 3);
  return best_distance <= allowed ? best : std::string();
}

}  // namespace trainer
