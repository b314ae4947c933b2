// In-process fuzzing of recipe loading: thousands of mutated recipes; the only acceptable
// outcomes are a loaded recipe or a UserError with a message. Anything else (another exception,
// a crash under the sanitiser-free build, a hang) fails the test.
#include <catch2/catch.hpp>
#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"
#include "process.h"
#include "recipe/load.h"
#include "recipe/schema.h"
#include "recipe_mutator.h"

using namespace trainer;

TEST_CASE("fuzz: mutated recipes load or fail with a user error", "[recipe][fuzz]") {
  std::vector<std::string> schema_paths;
  for (const auto& spec : recipe::schema()) schema_paths.push_back(spec.path);
  std::vector<nlohmann::json> seeds;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_dir() + "/recipes"))
    if (entry.path().extension() == ".json") seeds.push_back(read_json_file(entry.path().string()));
  REQUIRE(seeds.size() >= 8);

  int accepted = 0, rejected = 0;
  for (uint64_t seed = 1; seed <= 4000; ++seed) {
    test::RecipeMutator mutator(seed);
    const auto& base = seeds[seed % seeds.size()];
    const auto mutated = mutator.mutate(base, schema_paths);
    recipe::LoadOptions options;
    options.overrides = mutated.overrides;
    if (seed % 3 == 0) options.world_size = static_cast<int64_t>(seed % 97);
    try {
      recipe::load_recipe_text(mutated.text, "fuzz.json", ".", options);
      ++accepted;
    } catch (const UserError& e) {
      INFO("seed " << seed << ": " << mutated.description);
      CHECK(std::string(e.what()).size() > 0);
      ++rejected;
    } catch (const std::exception& e) {
      FAIL("seed " << seed << " (" << mutated.description << ") threw a non-user error: " << e.what());
    }
  }
  // Both outcomes must occur, or the mutator is not exercising anything.
  CHECK(accepted > 50);
  CHECK(rejected > 1000);
}
