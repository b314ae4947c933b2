// The reordering of a sequence of documents for ring attention (parallel/context/document_layout.h):
// a permutation that keeps every document's tokens in order, from whose reordered ids the data's
// places and the offsets in the documents come back, and whose zigzag parts balance the causal
// attention work of the documents across the cp ranks better than the plain zigzag split.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "parallel/context/document_layout.h"

using namespace trainer;

namespace {

std::vector<int64_t> ids_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> ids;
  for (size_t d = 0; d < lengths.size(); ++d) ids.insert(ids.end(), size_t(lengths[d]), int64_t(d));
  return ids;
}

// The causal work of each cp rank (the keys each query attends in its document) when the sequence
// is in the order `layout` and split zigzag.
std::vector<double> rank_work(const std::vector<int64_t>& lengths, const std::vector<int64_t>& layout, int64_t cp) {
  const std::vector<int64_t> ids = ids_of(lengths);
  std::vector<int64_t> starts(lengths.size());
  std::exclusive_scan(lengths.begin(), lengths.end(), starts.begin(), int64_t(0));
  const int64_t c = int64_t(layout.size()) / (2 * cp);
  std::vector<double> work(static_cast<size_t>(cp), 0);
  for (size_t i = 0; i < layout.size(); ++i) {
    const int64_t chunk = int64_t(i) / c, rank = std::min(chunk, 2 * cp - 1 - chunk);
    const int64_t place = layout[i];
    work[size_t(rank)] += double(place - starts[size_t(ids[size_t(place)])] + 1);
  }
  return work;
}

double max_over_mean(const std::vector<double>& work) {
  return *std::max_element(work.begin(), work.end()) / (std::accumulate(work.begin(), work.end(), 0.0) / double(work.size()));
}

}  // namespace

TEST_CASE("document layout: a permutation keeping each document in order - places and offsets come back from the ids",
          "[parallel][documents]") {
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{1, 5, 1, 2, 3}, 2},                     // 12 tokens, chunks of 3
      {{10, 1, 1}, 2},                          // one document over nearly everything
      {{7, 7, 7, 7, 2, 1, 1}, 4},               // 32 tokens, documents longer than a chunk of 4
      {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 3},  // 12 documents of one token, chunks of 2
      {{95, 3, 17, 1, 40, 13, 2, 9, 30, 6, 2, 2}, 5},  // 220 tokens, odd sizes
      {{2, 3, 2, 3, 2}, 3},                      // nothing fits whole in a chunk of 2 but length 2
  };
  for (const auto& [lengths, cp] : cases) {
    const std::vector<int64_t> layout = parallel::document_layout(lengths, cp);
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
    INFO("cp " << cp << ", " << total << " tokens");
    std::vector<int64_t> sorted = layout;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> every(static_cast<size_t>(total));
    std::iota(every.begin(), every.end(), int64_t(0));
    REQUIRE(sorted == every);
    // Each document's tokens come in increasing places.
    const std::vector<int64_t> ids = ids_of(lengths);
    std::vector<int64_t> last(lengths.size(), -1);
    for (const int64_t place : layout) {
      CHECK(place > last[size_t(ids[size_t(place)])]);
      last[size_t(ids[size_t(place)])] = place;
    }
    // The reordered ids give back the places and the offsets.
    const at::Tensor data_ids = at::tensor(ids, at::kLong).view({1, total});
    const at::Tensor places = at::tensor(layout, at::kLong).view({1, total});
    const at::Tensor reordered = data_ids.gather(1, places);
    CHECK(at::equal(parallel::document_order(reordered), places));
    std::vector<int64_t> starts(lengths.size());
    std::exclusive_scan(lengths.begin(), lengths.end(), starts.begin(), int64_t(0));
    const at::Tensor starts_of = at::tensor(starts, at::kLong).index_select(0, reordered[0]).view({1, total});
    CHECK(at::equal(parallel::document_offsets(reordered), places - starts_of));
    // The tensor form, sample by sample.
    CHECK(at::equal(parallel::document_layout(at::cat({data_ids, data_ids}), cp), at::cat({places, places})));
  }
  // One document over the whole sequence: the plain zigzag split, nothing moves.
  const std::vector<int64_t> whole = parallel::document_layout({24}, 3);
  for (size_t i = 0; i < whole.size(); ++i) CHECK(whole[i] == int64_t(i));
  CHECK_THROWS_WITH(parallel::document_layout({5, 6}, 2), Catch::Contains("do not split into 2 * cp = 4 chunks"));
}

TEST_CASE("document layout: balances the documents' causal work across cp ranks", "[parallel][documents]") {
  // A window of 4096 tokens: one long document at the end, short ones before it (the plain zigzag
  // split gives the ranks holding the end most of the work), and a mixed window.
  const std::vector<std::pair<std::vector<int64_t>, int64_t>> cases = {
      {{100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 3546}, 4},
      {{2000, 37, 600, 5, 900, 311, 13, 230}, 4},
      {{700, 650, 600, 550, 500, 450, 400, 246}, 2}};
  for (const auto& [lengths, cp] : cases) {
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
    std::vector<int64_t> identity(static_cast<size_t>(total));
    std::iota(identity.begin(), identity.end(), int64_t(0));
    const double plain = max_over_mean(rank_work(lengths, identity, cp));
    const double balanced = max_over_mean(rank_work(lengths, parallel::document_layout(lengths, cp), cp));
    INFO("cp " << cp << ": busiest rank over the mean, plain zigzag " << plain << ", reordered " << balanced);
    CHECK(balanced <= 1.02);
    CHECK(balanced < plain);
  }
}
