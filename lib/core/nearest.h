#pragma once
// "Did you mean": the candidate closest to a misspelt word.
#include <string>
#include <vector>

namespace trainer {

// Levenshtein distance between two strings (case-sensitive).
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `word`, or "" when none is plausibly what was meant
// (distance more than about a third of the word's length, at least 2).
std::string nearest_candidate(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace trainer
