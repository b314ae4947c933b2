#include <catch2/catch.hpp>

#include "core/nearest.h"

using trainer::edit_distance;
using trainer::nearest_candidate;

TEST_CASE("edit distance counts insertions - deletions and substitutions", "[core]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("tp", "tp") == 0);
  CHECK(edit_distance("tpp", "tp") == 1);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
}

TEST_CASE("nearest candidate finds plausible misspellings only", "[core]") {
  const std::vector<std::string> keys = {"tp", "pp", "vpp", "cp", "ep", "etp", "dp", "sequence_parallel", "zero"};
  CHECK(nearest_candidate("sequence_paralel", keys) == "sequence_parallel");
  CHECK(nearest_candidate("TP", keys) == "tp");
  CHECK(nearest_candidate("zer0", keys) == "zero");
  CHECK(nearest_candidate("completely_unrelated_name", keys).empty());
  CHECK(nearest_candidate("x", {}).empty());
}

TEST_CASE("nearest candidate takes an abbreviation for the shortest name it begins", "[core]") {
  const std::vector<std::string> gpus = {"a100-80g", "h100-sxm", "h100-pcie", "h200", "b200"};
  CHECK(nearest_candidate("h100", gpus) == "h100-sxm");  // not h200, one edit away
  CHECK(nearest_candidate("a100", gpus) == "a100-80g");
}
