#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <thread>

#include "core/error.h"
#include "data/synthetic_dataset.h"

using trainer::data::default_synthetic_params;
using trainer::data::SyntheticDataset;

namespace {
std::vector<int32_t> tokens_of(const SyntheticDataset& data, uint64_t index, int64_t seq_len = 64) {
  std::vector<int32_t> out(seq_len + 1, -1);
  data.sample(index, seq_len, out.data());
  return out;
}
}  // namespace

TEST_CASE("data: synthetic samples are a pure function of seed and index", "[data]") {
  const SyntheticDataset a(default_synthetic_params(256, 7)), b(default_synthetic_params(256, 7));
  const SyntheticDataset other_seed(default_synthetic_params(256, 8));
  for (uint64_t index : {0ULL, 1ULL, 2ULL, 1000ULL, 1ULL << 40, ~0ULL}) {
    CHECK(tokens_of(a, index) == tokens_of(b, index));
    CHECK(tokens_of(a, index) == tokens_of(a, index));  // no hidden cursor
    CHECK(tokens_of(a, index) != tokens_of(a, index + 1));
    CHECK(tokens_of(a, index) != tokens_of(other_seed, index));
  }
  // A shorter sample is a prefix of a longer one: seq_len changes nothing but where it stops.
  const auto long_sample = tokens_of(a, 5, 128);
  const auto short_sample = tokens_of(a, 5, 16);
  CHECK(std::equal(short_sample.begin(), short_sample.end(), long_sample.begin()));
}

TEST_CASE("data: synthetic samples are the same from several threads", "[data]") {
  const SyntheticDataset data(default_synthetic_params(512, 3));
  std::vector<std::vector<int32_t>> expected;
  for (uint64_t i = 0; i < 64; ++i) expected.push_back(tokens_of(data, i));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 64; ++i) {  // each thread starts at a different index
        const uint64_t index = (i + 16 * t) % 64;
        if (tokens_of(data, index) != expected[index]) ++mismatches[t];
      }
    });
  for (auto& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("data: synthetic tokens follow the chain and stay in the vocabulary", "[data]") {
  const SyntheticDataset data(default_synthetic_params(256, 1234));
  REQUIRE(data.successor_count() == 4);
  std::vector<int> first_token_seen(256, 0);
  for (uint64_t index = 0; index < 4000; ++index) {
    const auto tokens = tokens_of(data, index, 32);
    ++first_token_seen[tokens[0]];
    for (size_t t = 0; t < tokens.size(); ++t) {
      REQUIRE(tokens[t] >= 0);
      REQUIRE(tokens[t] < 256);
      if (t == 0) continue;
      bool is_successor = false;
      for (int r = 0; r < 4; ++r) is_successor |= data.successor(tokens[t - 1], r) == tokens[t];
      REQUIRE(is_successor);
    }
  }
  // The first token is uniform over the vocabulary: 4000 draws reach every one of 256 values.
  CHECK(std::count(first_token_seen.begin(), first_token_seen.end(), 0) == 0);
  // Successors of a token are distinct, so the conditional entropy is exactly H(p).
  for (int32_t token = 0; token < 256; ++token)
    for (int r = 0; r < 4; ++r)
      for (int s = 0; s < r; ++s) REQUIRE(data.successor(token, r) != data.successor(token, s));
}

TEST_CASE("data: the default floor is H(0.5 - 0.25 - 0.15 - 0.1) in nats", "[data]") {
  const SyntheticDataset data(default_synthetic_params(256, 1234));
  const double expected = -(0.5 * std::log(0.5) + 0.25 * std::log(0.25) + 0.15 * std::log(0.15) + 0.1 * std::log(0.1));
  REQUIRE(data.entropy_floor().has_value());
  CHECK(*data.entropy_floor() == Approx(expected).epsilon(1e-12));
  CHECK(*data.entropy_floor() == Approx(1.2080).margin(1e-4));
  CHECK(data.describe() == "synthetic (order-1 Markov, vocab 256, 4 successors per token, floor 1.2080 nats)");
}

TEST_CASE("data: the empirical conditional entropy of the samples matches the floor", "[data]") {
  // The plug-in estimate of H(next | previous) from transition counts; with about 1000
  // transitions per state its bias is about -(k - 1) / (2 * 1000) = -0.0015 nats.
  const int64_t vocab = 256, seq_len = 128;
  const SyntheticDataset data(default_synthetic_params(vocab, 99));
  std::vector<std::map<int32_t, double>> counts(vocab);
  double transitions = 0;
  for (uint64_t index = 0; index < 2000; ++index) {
    const auto tokens = tokens_of(data, index, seq_len);
    for (int64_t t = 1; t <= seq_len; ++t) counts[tokens[t - 1]][tokens[t]] += 1;
    transitions += seq_len;
  }
  double entropy = 0;
  for (const auto& row : counts) {
    double row_total = 0;
    for (const auto& [next, n] : row) row_total += n;
    for (const auto& [next, n] : row) entropy -= n / transitions * std::log(n / row_total);
  }
  CHECK(entropy == Approx(*data.entropy_floor()).margin(0.01));
  // Far below the entropy of uniform tokens, which is what an untrained model starts at.
  CHECK(entropy < std::log(double(vocab)) - 4);
}

TEST_CASE("data: a small vocabulary keeps fewer successors - renormalised", "[data]") {
  const auto params = default_synthetic_params(2, 1);
  REQUIRE(params.successor_probs.size() == 2);
  CHECK(params.successor_probs[0] == Approx(2.0 / 3));
  const SyntheticDataset data(params);
  CHECK(*data.entropy_floor() == Approx(-(2.0 / 3 * std::log(2.0 / 3) + 1.0 / 3 * std::log(1.0 / 3))));
  for (int32_t token : tokens_of(data, 0)) CHECK((token == 0 || token == 1));

  const SyntheticDataset single(default_synthetic_params(1, 1));
  CHECK(*single.entropy_floor() == 0);
  CHECK(tokens_of(single, 3, 4) == std::vector<int32_t>(5, 0));
}

TEST_CASE("data: a vocabulary below 1 is a user error", "[data]") {
  CHECK_THROWS_AS(SyntheticDataset(default_synthetic_params(0, 1)), trainer::UserError);
}
