#pragma once
// Mutations of valid recipes for fuzz tests: deleted keys, swapped types, perturbed numbers,
// unknown keys, --set overrides of random keys, and garbage bytes in the text.
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace trainer::test {

struct MutatedRecipe {
  std::string text;                    // the recipe file's content
  std::vector<std::string> overrides;  // --set KEY=VALUE
  std::string description;             // what was done, for failure messages
};

class RecipeMutator {
 public:
  explicit RecipeMutator(uint64_t seed) : rng_(seed) {}
  MutatedRecipe mutate(const nlohmann::json& recipe, const std::vector<std::string>& schema_paths);

 private:
  nlohmann::json random_value();
  nlohmann::json perturb(const nlohmann::json& number);
  std::string garble(std::string text);
  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  std::mt19937_64 rng_;
};

}  // namespace trainer::test
