#include "parallel/context/document_layout.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace trainer::parallel {

namespace {

// Calls `each(b, ids, out)` for every sample with its ids and the row of a new int64 CPU result.
template <typename Each>
at::Tensor per_sample(const at::Tensor& documents, Each each) {
  const at::Tensor ids = documents.to(at::kCPU, at::kLong).contiguous();
  at::Tensor out = at::empty_like(ids);
  const int64_t t = ids.size(1);
  for (int64_t b = 0; b < ids.size(0); ++b) each(ids.data_ptr<int64_t>() + b * t, out.data_ptr<int64_t>() + b * t, t);
  return out.to(documents.device());
}

// The documents' lengths in one sample, from ids numbered 0, 1, ...
std::vector<int64_t> lengths_of(const int64_t* ids, int64_t t) {
  std::vector<int64_t> lengths(size_t(t == 0 ? 0 : *std::max_element(ids, ids + t) + 1), 0);
  for (int64_t i = 0; i < t; ++i) ++lengths[size_t(ids[i])];
  return lengths;
}

// The causal work of `length` queries at offsets offset, offset + 1, ... of their document: each
// attends the keys before it and itself.
double causal_work(int64_t offset, int64_t length) { return double(length) * double(2 * offset + length + 1) / 2; }

}  // namespace

at::Tensor document_offsets(const at::Tensor& documents) {
  return per_sample(documents, [](const int64_t* ids, int64_t* out, int64_t t) {
    std::vector<int64_t> seen(lengths_of(ids, t).size(), 0);
    for (int64_t i = 0; i < t; ++i) out[i] = seen[size_t(ids[i])]++;
  });
}

at::Tensor document_order(const at::Tensor& documents) {
  return per_sample(documents, [](const int64_t* ids, int64_t* out, int64_t t) {
    const std::vector<int64_t> lengths = lengths_of(ids, t);
    std::vector<int64_t> next(lengths.size(), 0);  // the next place of each document
    std::exclusive_scan(lengths.begin(), lengths.end(), next.begin(), int64_t(0));
    for (int64_t i = 0; i < t; ++i) out[i] = next[size_t(ids[i])]++;
  });
}

std::vector<int64_t> document_layout(const std::vector<int64_t>& lengths, int64_t cp) {
  const int64_t chunks = 2 * cp, total = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
  if (cp < 1 || total % chunks != 0)
    throw std::invalid_argument(
        fmt::format("document layout: {} tokens do not split into 2 * cp = {} chunks", total, chunks));
  const int64_t c = total / chunks;
  const auto rank_of = [chunks](int64_t chunk) { return std::min(chunk, chunks - 1 - chunk); };
  std::vector<int64_t> starts(lengths.size(), 0);
  std::exclusive_scan(lengths.begin(), lengths.end(), starts.begin(), int64_t(0));
  std::vector<int64_t> space(static_cast<size_t>(chunks), c);
  std::vector<double> work(static_cast<size_t>(cp), 0);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(static_cast<size_t>(chunks));  // (data start, length)
  const auto place = [&](int64_t document, int64_t chunk, int64_t offset, int64_t length) {
    if (length == 0) return;
    ranges[size_t(chunk)].push_back({starts[size_t(document)] + offset, length});
    space[size_t(chunk)] -= length;
    work[size_t(rank_of(chunk))] += causal_work(offset, length);
  };
  const auto roomiest = [&] { return int64_t(std::max_element(space.begin(), space.end()) - space.begin()); };

  // Documents longer than a chunk: equal pieces (their sum fits, as the documents fit the
  // sequence), then the remainders token by token into the chunks with the most room left, so that
  // every chunk ends exactly full.
  std::vector<std::vector<int64_t>> pieces(lengths.size());
  for (size_t d = 0; d < lengths.size(); ++d)
    if (lengths[d] > c) {
      pieces[d].assign(size_t(chunks), lengths[d] / chunks);
      for (int64_t& s : space) s -= lengths[d] / chunks;
    }
  for (size_t d = 0; d < lengths.size(); ++d)
    for (int64_t extra = 0; !pieces[d].empty() && extra < lengths[d] % chunks; ++extra) {
      const int64_t k = roomiest();
      ++pieces[d][size_t(k)];
      --space[size_t(k)];
    }
  for (size_t d = 0; d < lengths.size(); ++d) {
    if (pieces[d].empty()) continue;
    int64_t offset = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t length = pieces[d][size_t(k)];
      space[size_t(k)] += length;  // place() takes it again
      place(int64_t(d), k, offset, length);
      offset += length;
    }
  }

  // Shorter documents, longest first, whole into a chunk of the rank with the least work that has
  // room; one that fits nowhere whole fills the chunks with room in increasing order.
  std::vector<int64_t> shorter;
  for (size_t d = 0; d < lengths.size(); ++d)
    if (lengths[d] > 0 && lengths[d] <= c) shorter.push_back(int64_t(d));
  std::stable_sort(shorter.begin(), shorter.end(),
                   [&](int64_t a, int64_t b) { return lengths[size_t(a)] > lengths[size_t(b)]; });
  for (const int64_t d : shorter) {
    const int64_t length = lengths[size_t(d)];
    int64_t best = -1;
    for (int64_t k = 0; k < chunks; ++k)
      if (space[size_t(k)] >= length && (best < 0 || work[size_t(rank_of(k))] < work[size_t(rank_of(best))])) best = k;
    if (best >= 0) {
      place(d, best, 0, length);
      continue;
    }
    int64_t offset = 0;
    for (int64_t k = 0; k < chunks && offset < length; ++k) {
      const int64_t take = std::min(space[size_t(k)], length - offset);
      place(d, k, offset, take);
      offset += take;
    }
  }

  std::vector<int64_t> layout;
  layout.reserve(size_t(total));
  for (int64_t k = 0; k < chunks; ++k) {
    if (space[size_t(k)] != 0)
      throw std::logic_error(fmt::format("document layout: chunk {} left with {} free places", k, space[size_t(k)]));
    std::sort(ranges[size_t(k)].begin(), ranges[size_t(k)].end());
    for (const auto& [start, length] : ranges[size_t(k)])
      for (int64_t i = 0; i < length; ++i) layout.push_back(start + i);
  }
  return layout;
}

at::Tensor document_layout(const at::Tensor& documents, int64_t cp) {
  return per_sample(documents, [cp](const int64_t* ids, int64_t* out, int64_t t) {
    const std::vector<int64_t> layout = document_layout(lengths_of(ids, t), cp);
    std::copy(layout.begin(), layout.end(), out);
  });
}

}  // namespace trainer::parallel
