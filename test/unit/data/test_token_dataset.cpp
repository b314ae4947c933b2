#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <thread>

#include "data/dataset.h"
#include "data/token_dataset.h"
#include "data_fixture.h"
#include "process.h"

using trainer::data::open_dataset;
using trainer::data::TokenDataset;
using trainer::data::write_token_files;
using trainer::test::TempDir;
using namespace trainer::data::test;

namespace {
trainer::recipe::Recipe token_recipe(std::vector<std::string> paths, int64_t seq_len, int64_t vocab = 65536) {
  trainer::recipe::Recipe recipe;
  recipe.model.vocab_size = vocab;
  recipe.training.seq_len = seq_len;
  recipe.training.seed = 42;
  recipe.data.source = trainer::recipe::DataSource::Tokens;
  recipe.data.paths = std::move(paths);
  return recipe;
}

std::vector<int32_t> sample_of(const trainer::data::Dataset& data, uint64_t index, int64_t seq_len) {
  std::vector<int32_t> out(seq_len + 1, -1);
  data.sample(index, seq_len, out.data());
  return out;
}
}  // namespace

TEST_CASE("data: open_dataset gives the synthetic generator for source synthetic", "[data]") {
  trainer::recipe::Recipe recipe;
  recipe.model.vocab_size = 256;
  const auto data = open_dataset(recipe);
  REQUIRE(data->entropy_floor().has_value());
  CHECK(*data->entropy_floor() == Approx(1.2080).margin(1e-4));
  CHECK(data->describe() == "synthetic (order-1 Markov, vocab 256, 4 successors per token, floor 1.2080 nats)");
  // training.seed keys it.
  recipe.training.seed = 1;
  CHECK(sample_of(*open_dataset(recipe), 0, 16) != sample_of(*data, 0, 16));
}

TEST_CASE("data: token samples are windows - each reached once per epoch in a fresh order", "[data]") {
  TempDir dir;
  // 1001 tokens 0..1000 in three documents: 1000 / 8 = 125 windows of 9 tokens with stride 8.
  write_token_files(dir.path() + "/c", counting_documents({300, 500, 201}), 65536);
  const int64_t seq_len = 8;
  const auto data = open_dataset(token_recipe({dir.path() + "/c"}, seq_len));
  CHECK(data->describe() == "tokens: 1 file (trainer), 3 documents, 1001 tokens");
  CHECK_FALSE(data->entropy_floor().has_value());

  const uint64_t windows = 125;
  std::vector<std::vector<int32_t>> epochs(3);
  for (uint64_t i = 0; i < 3 * windows; ++i) {
    const auto tokens = sample_of(*data, i, seq_len);
    // A window: seq_len + 1 consecutive tokens starting at a multiple of seq_len.
    REQUIRE(tokens[0] % seq_len == 0);
    for (int64_t t = 1; t <= seq_len; ++t) REQUIRE(tokens[t] == tokens[0] + t);
    epochs[i / windows].push_back(tokens[0] / seq_len);
  }
  for (const auto& epoch : epochs) {
    CHECK(std::set<int32_t>(epoch.begin(), epoch.end()).size() == windows);  // a permutation
    CHECK(*std::max_element(epoch.begin(), epoch.end()) == int32_t(windows - 1));
  }
  CHECK(epochs[0] != epochs[1]);
  CHECK(epochs[1] != epochs[2]);

  // A pure function of (files, seed, index): a second open, any order, any thread.
  const auto again = open_dataset(token_recipe({dir.path() + "/c"}, seq_len));
  std::vector<int> mismatches(3, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = 3 * windows; i-- > 0;)
        if (sample_of(*again, i, seq_len)[0] / seq_len != epochs[i / windows][i % windows]) ++mismatches[t];
    });
  for (auto& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>(3, 0));

  // Another seed, another order.
  auto recipe = token_recipe({dir.path() + "/c"}, seq_len);
  recipe.training.seed = 43;
  const auto reseeded = open_dataset(recipe);
  std::vector<int32_t> first_epoch;
  for (uint64_t i = 0; i < windows; ++i) first_epoch.push_back(sample_of(*reseeded, i, seq_len)[0] / seq_len);
  CHECK(first_epoch != epochs[0]);
}

TEST_CASE("data: a dataset of exactly seq_len + 1 tokens has one window", "[data]") {
  TempDir dir;
  write_token_files(dir.path() + "/one", counting_documents({17}), 256);
  const auto data = open_dataset(token_recipe({dir.path() + "/one"}, 16, 256));
  for (uint64_t i : {0ULL, 1ULL, 99ULL}) CHECK(sample_of(*data, i, 16) == counting_documents({17})[0]);
}

TEST_CASE("data: mixing follows data.weights - and dataset sizes when they are null", "[data]") {
  TempDir dir;
  // Dataset A holds ids 0..3999, B ids 10000..11999: a sample's first token says where it came from.
  write_token_files(dir.path() + "/a", counting_documents({4000}), 65536);
  write_token_files(dir.path() + "/b", counting_documents({2000}, 10000), 65536);
  const int64_t seq_len = 16;
  auto fraction_from_a = [&](const trainer::data::Dataset& data, uint64_t n) {
    uint64_t from_a = 0;
    for (uint64_t i = 0; i < n; ++i) from_a += sample_of(data, i, seq_len)[0] < 10000;
    return double(from_a) / double(n);
  };
  auto recipe = token_recipe({dir.path() + "/a", dir.path() + "/b"}, seq_len);

  SECTION("null weights: in proportion to token counts (2:1)") {
    const auto data = open_dataset(recipe);
    CHECK(data->describe() == "tokens: 2 files (trainer), 2 documents, 6000 tokens, weights 0.667/0.333");
    // Within (m - 1) / 2 = 0.5 samples of the exact share at every prefix: 1e-4 over 20000 samples.
    CHECK(fraction_from_a(*data, 20000) == Approx(2.0 / 3).margin(1e-4));
  }
  SECTION("explicit weights, against the sizes") {
    recipe.data.weights = {0.1, 0.9};
    const auto data = open_dataset(recipe);
    CHECK(fraction_from_a(*data, 20000) == Approx(0.1).margin(1e-4));
    // The smaller dataset B is repeated more often; every one of its windows is still reached
    // exactly once per epoch.
    std::map<int32_t, int> window_visits;
    const uint64_t b_windows = (2000 - 1) / seq_len;  // 124
    uint64_t b_samples = 0;
    for (uint64_t i = 0; b_samples < 2 * b_windows; ++i) {
      const auto tokens = sample_of(*data, i, seq_len);
      if (tokens[0] < 10000) continue;
      ++window_visits[(tokens[0] - 10000) / seq_len];
      ++b_samples;
    }
    CHECK(window_visits.size() == b_windows);
    for (const auto& [window, visits] : window_visits) CHECK(visits == 2);
  }
  SECTION("a path may name the .bin file") {
    recipe.data.paths = {dir.path() + "/a.bin", dir.path() + "/b.idx"};
    CHECK(open_dataset(recipe)->describe() == "tokens: 2 files (trainer), 2 documents, 6000 tokens, weights 0.667/0.333");
  }
}

TEST_CASE("data: bad token data is a user error naming the file", "[data]") {
  TempDir dir;
  write_token_files(dir.path() + "/short", counting_documents({10, 6}), 256);
  write_token_files(dir.path() + "/wide", counting_documents({100}, 200), 300);
  using Catch::Matchers::StartsWith;

  CHECK(user_error_of([&] { open_dataset(token_recipe({dir.path() + "/short"}, 16)); }) ==
        dir.path() + "/short: 16 tokens, too few for one sample of training.seq_len + 1 = 17 tokens");
  CHECK_NOTHROW(open_dataset(token_recipe({dir.path() + "/short"}, 15)));
  CHECK_THAT(user_error_of([&] { open_dataset(token_recipe({dir.path() + "/wide"}, 8, 256)); }),
             StartsWith(dir.path() + "/wide.bin: holds token ids up to 299 (header), outside the vocabulary of "
                                     "model.vocab_size=256"));
  CHECK_THAT(user_error_of([&] { open_dataset(token_recipe({dir.path() + "/short", dir.path() + "/none"}, 8)); }),
             StartsWith(dir.path() + "/none: no such file, and no " + dir.path() + "/none.bin and"));
  CHECK_THAT(user_error_of([&] { open_dataset(token_recipe({}, 8)); }), StartsWith("data.source=\"tokens\" needs data.paths"));
  auto recipe = token_recipe({dir.path() + "/short"}, 8);
  recipe.data.weights = {1, 2};
  CHECK_THAT(user_error_of([&] { open_dataset(recipe); }), StartsWith("data.weights has 2 entries but data.paths has 1"));
}
