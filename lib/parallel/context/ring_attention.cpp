#include "parallel/context/ring_attention.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "parallel/context/attention_block.h"
#include "parallel/context/causal_sdpa.h"
#include "parallel/context/document_layout.h"
#include "parallel/context/zigzag.h"
#include "parallel/tensor/group_handle.h"

namespace trainer::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Tags: the keys and values of step i travel with tag i, the dK/dV of step i with kDkvTag + i.
constexpr int64_t kDkvTag = 1 << 20;

// Sends `data` to the next rank of the ring and receives the same shape from the previous one.
struct RingExchange {
  at::Tensor outgoing, incoming;  // both alive until the exchange is done
  std::unique_ptr<comm::Work> work;
  RingExchange(comm::Communicator& cp, const at::Tensor& data, int64_t tag)
      : outgoing(data), incoming(at::empty_like(data)) {
    const int64_t n = cp.size(), r = cp.rank();
    work = cp.send_recv({{comm::P2POp::Kind::Send, data, (r + 1) % n, tag},
                         {comm::P2POp::Kind::Recv, incoming, (r + n - 1) % n, tag}});
  }
  at::Tensor take() {
    work->wait();
    return incoming;
  }
};

// Which part of step i's work this rank does: the block of keys and values from rank j = r - i.
enum class Part { Diagonal, FirstKeyChunk, SecondQueryChunk };
Part part_of(int64_t step, int64_t rank, int64_t n) {
  if (step == 0) return Part::Diagonal;
  const int64_t source = (rank - step + n) % n;
  return source < rank ? Part::FirstKeyChunk : Part::SecondQueryChunk;
}

at::ScalarType accumulation_type(const at::Tensor& q) { return at::promote_types(q.scalar_type(), at::kFloat); }

// With a sliding window: the pairs (this rank's query chunk, the block's key chunk) of step i that
// attend anything, each with its band and the number of leading query rows that attend a key. The
// zigzag chunks of rank x are x and 2n-1-x; blocks wholly outside the window are left out.
struct BandPair {
  int64_t query_chunk, key_chunk;  // 0 or 1: which of the two local chunks
  Band band;
  int64_t rows;
};

std::vector<BandPair> band_pairs(int64_t step, int64_t rank, int64_t n, int64_t c, int64_t window) {
  const int64_t source = (rank - step + n) % n;
  const int64_t query_chunks[] = {rank, 2 * n - 1 - rank}, key_chunks[] = {source, 2 * n - 1 - source};
  std::vector<BandPair> pairs;
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t offset = (query_chunks[a] - key_chunks[b]) * c;
      if (offset < 0) continue;  // keys in the queries' future
      const Band band{offset, window};
      const int64_t rows = band_rows(band, c, c);
      if (rows > 0) pairs.push_back({a, b, band, rows});
    }
  return pairs;
}

// With document masking: the parts of step i's block that attend anything. Every position's
// document and offset in it come from the whole sequence's ids (document_layout.h); this rank's
// queries and the block's keys (rank source's zigzag part) fall into runs of one document inside
// one chunk, and only pairs of runs of the same document are attended, each with the mask of
// which keys its queries see (not in their future by offset, inside any window): work per
// document, not per block.
struct Run {
  int64_t document, start, length;
};

struct LocalDocuments {
  std::vector<std::vector<Run>> runs;  // per sample
  at::Tensor offsets;                  // int64 CPU [B, L]: each local position's offset in its document
};

LocalDocuments local_documents(const at::Tensor& ids, const at::Tensor& offsets, int64_t n, int64_t rank) {
  const at::Tensor positions = zigzag_positions(ids.size(1), n, rank, ids.options());
  const at::Tensor local = ids.index_select(1, positions).contiguous();
  LocalDocuments result{{}, offsets.index_select(1, positions).contiguous()};
  const int64_t length = local.size(1);
  for (int64_t b = 0; b < local.size(0); ++b) {
    const int64_t* row = local.data_ptr<int64_t>() + b * length;
    std::vector<Run> runs;
    // Runs break between the two zigzag chunks too: a document's part of one chunk all comes
    // before or after its part of another (document_layout.h), so without a window every pair
    // of runs is a run with itself (causal) or wholly visible, and the flash kernel takes it.
    for (int64_t i = 0; i < length; ++i)
      if (i == 0 || i == length / 2 || row[i] != row[i - 1])
        runs.push_back({row[i], i, 1});
      else
        ++runs.back().length;
    result.runs.push_back(std::move(runs));
  }
  return result;
}

struct DocumentBlock {
  enum class Kind { Masked, Full, Causal };  // Full: every query sees every key; Causal: a run with itself
  int64_t sample, query_start, query_length, key_start, key_length;
  Kind kind;
  at::Tensor mask;  // Masked only: bool [1, 1, query_length, key_length] on the queries' device
};

std::vector<DocumentBlock> document_blocks(const LocalDocuments& queries, const LocalDocuments& keys, bool same_rank,
                                           int64_t window, const at::Device& device) {
  std::vector<DocumentBlock> blocks;
  for (size_t b = 0; b < queries.runs.size(); ++b) {
    std::unordered_map<int64_t, std::vector<const Run*>> key_runs;
    for (const Run& run : keys.runs[b]) key_runs[run.document].push_back(&run);
    for (const Run& q : queries.runs[b]) {
      const auto found = key_runs.find(q.document);
      if (found == key_runs.end()) continue;
      for (const Run* k : found->second) {
        DocumentBlock block{int64_t(b), q.start, q.length, k->start, k->length, DocumentBlock::Kind::Masked, {}};
        if (same_rank && q.start == k->start && (window == 0 || q.length <= window)) {
          // Offsets rise by one along a run: the run against itself is plain causal attention
          // (inside any window it fits).
          block.kind = DocumentBlock::Kind::Causal;
          blocks.push_back(block);
          continue;
        }
        // Offsets rise by one along a run: its first and last bound every query-key distance.
        const at::Tensor& query_offsets = queries.offsets[int64_t(b)];
        const at::Tensor& key_offsets = keys.offsets[int64_t(b)];
        const int64_t q_first = query_offsets[q.start].item<int64_t>(), k_first = key_offsets[k->start].item<int64_t>();
        const int64_t largest = q_first + q.length - 1 - k_first, smallest = q_first - (k_first + k->length - 1);
        if (largest < 0 || (window > 0 && smallest >= window)) continue;  // every key in the future, or out of the window
        if (smallest >= 0 && (window == 0 || largest < window)) {
          block.kind = DocumentBlock::Kind::Full;
        } else {
          const at::Tensor distance = query_offsets.narrow(0, q.start, q.length).unsqueeze(1) -
                                      key_offsets.narrow(0, k->start, k->length).unsqueeze(0);
          at::Tensor mask = distance.ge(0);
          if (window > 0) mask.logical_and_(distance.lt(window));
          block.mask = mask.view({1, 1, q.length, k->length}).to(device);
        }
        blocks.push_back(std::move(block));
      }
    }
  }
  return blocks;
}

// Every rank's LocalDocuments for the ids [B, T] of the whole sequence.
std::vector<LocalDocuments> all_local_documents(const at::Tensor& documents, int64_t n) {
  const at::Tensor ids = documents.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor offsets = document_offsets(ids);
  std::vector<LocalDocuments> all;
  for (int64_t x = 0; x < n; ++x) all.push_back(local_documents(ids, offsets, n, x));
  return all;
}

// The rows of `t` [B, heads, L, ...] of one document block's queries or keys.
at::Tensor rows_of(const at::Tensor& t, int64_t sample, int64_t start, int64_t length) {
  return t.narrow(0, sample, 1).narrow(2, start, length);
}

// The documents travel outside autograd's inputs (they have no gradient, and may be undefined).
struct DocumentIds {
  at::Tensor ids;
};

struct RingAttention : public torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            DocumentIds document_ids, c10::intrusive_ptr<GroupHandle> group, int64_t window) {
    const at::Tensor& documents = document_ids.ids;
    comm::Communicator& cp = *group->group;
    const int64_t n = cp.size(), r = cp.rank(), c = q.size(2) / 2;
    const at::Tensor query_second = q.narrow(2, c, c);
    at::Tensor kv = at::stack({k, v});  // [2, B, kv, 2c, d]: one message per step
    const std::vector<LocalDocuments> local = documents.defined() ? all_local_documents(documents, n) : std::vector<LocalDocuments>();
    at::Tensor out, lse;
    if (window > 0 || documents.defined()) {  // rows merge into zeros with a log-sum-exp of -inf
      out = at::zeros(q.sizes(), q.options().dtype(accumulation_type(q)));
      lse = at::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(), out.options());
    }
    for (int64_t step = 0; step < n; ++step) {
      std::optional<RingExchange> next;
      if (step + 1 < n) next.emplace(cp, kv, step);  // the next block travels while this one is attended
      const Part part = part_of(step, r, n);
      if (documents.defined()) {
        const int64_t source = (r - step + n) % n;
        for (const DocumentBlock& d : document_blocks(local[size_t(r)], local[size_t(source)], step == 0, window,
                                                      q.device())) {
          const at::Tensor qd = rows_of(q, d.sample, d.query_start, d.query_length);
          const at::Tensor kd = rows_of(kv[0], d.sample, d.key_start, d.key_length),
                           vd = rows_of(kv[1], d.sample, d.key_start, d.key_length);
          at::Tensor out_rows = rows_of(out, d.sample, d.query_start, d.query_length),
                     lse_rows = rows_of(lse, d.sample, d.query_start, d.query_length);
          merge_block(out_rows, lse_rows,
                      d.kind == DocumentBlock::Kind::Masked
                          ? attend_masked(qd, kd, vd, d.mask)
                          : attend_block(qd, kd, vd, /*causal=*/d.kind == DocumentBlock::Kind::Causal));
        }
      } else if (window > 0) {
        for (const BandPair& p : band_pairs(step, r, n, c, window)) {
          at::Tensor out_rows = out.narrow(2, p.query_chunk * c, p.rows), lse_rows = lse.narrow(2, p.query_chunk * c, p.rows);
          merge_block(out_rows, lse_rows,
                      attend_band(q.narrow(2, p.query_chunk * c, p.rows), kv[0].narrow(2, p.key_chunk * c, c),
                                  kv[1].narrow(2, p.key_chunk * c, c), p.band));
        }
      } else if (part == Part::Diagonal) {
        BlockAttention local = attend_block(q, kv[0], kv[1], /*causal=*/true);
        out = local.out.to(accumulation_type(q));
        lse = local.lse.to(accumulation_type(q));
      } else if (part == Part::FirstKeyChunk) {
        merge_block(out, lse, attend_block(q, kv[0].narrow(2, 0, c), kv[1].narrow(2, 0, c), false));
      } else {
        at::Tensor out_second = out.narrow(2, c, c), lse_second = lse.narrow(2, c, c);
        merge_block(out_second, lse_second, attend_block(query_second, kv[0], kv[1], false));
      }
      if (next) kv = next->take();
    }
    const at::Tensor result = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, result, lse});
    if (documents.defined()) ctx->saved_data["documents"] = documents;
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["window"] = window;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<GroupHandle>(ctx->saved_data["group"].toCapsule());
    comm::Communicator& cp = *group->group;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse_acc = saved[4];
    const auto found = ctx->saved_data.find("documents");
    const at::Tensor documents = found == ctx->saved_data.end() ? at::Tensor() : found->second.toTensor();
    const int64_t n = cp.size(), r = cp.rank(), c = q.size(2) / 2;
    const int64_t window = ctx->saved_data["window"].toInt();
    const at::Tensor grad_out = grads[0].contiguous();
    // The kernel takes the log-sum-exp in the dtype it produces.
    const at::Tensor lse = lse_acc.to(q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
    const auto second = [c](const at::Tensor& t) { return t.narrow(2, c, c); };
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(accumulation_type(q)));
    at::Tensor kv = at::stack({k, v});
    const std::vector<LocalDocuments> local = documents.defined() ? all_local_documents(documents, n) : std::vector<LocalDocuments>();
    std::optional<RingExchange> arriving_dkv;  // the dK/dV accumulated so far for the block arriving
    for (int64_t step = 0; step < n; ++step) {
      std::optional<RingExchange> next;
      if (step + 1 < n) next.emplace(cp, kv, step);
      at::Tensor dkv = at::zeros(kv.sizes(), kv.options().dtype(accumulation_type(q)));
      const Part part = part_of(step, r, n);
      if (documents.defined()) {
        const int64_t source = (r - step + n) % n;
        for (const DocumentBlock& d : document_blocks(local[size_t(r)], local[size_t(source)], step == 0, window,
                                                      q.device())) {
          const auto query_rows = [&](const at::Tensor& t) { return rows_of(t, d.sample, d.query_start, d.query_length); };
          const auto key_rows = [&](const at::Tensor& t) { return rows_of(t, d.sample, d.key_start, d.key_length); };
          const BlockGradients g =
              d.kind == DocumentBlock::Kind::Masked
                  ? attend_masked_backward(query_rows(grad_out), query_rows(q), key_rows(kv[0]), key_rows(kv[1]),
                                           query_rows(out), query_rows(lse), d.mask)
                  : attend_block_backward(query_rows(grad_out), query_rows(q), key_rows(kv[0]), key_rows(kv[1]),
                                          query_rows(out), query_rows(lse), d.kind == DocumentBlock::Kind::Causal);
          query_rows(dq).add_(g.dq);
          key_rows(dkv[0]).add_(g.dk);
          key_rows(dkv[1]).add_(g.dv);
        }
      } else if (window > 0) {
        for (const BandPair& p : band_pairs(step, r, n, c, window)) {
          const auto rows = [&](const at::Tensor& t) { return t.narrow(2, p.query_chunk * c, p.rows); };
          const auto keys = [&](const at::Tensor& t) { return t.narrow(2, p.key_chunk * c, c); };
          const BlockGradients g = attend_band_backward(rows(grad_out), rows(q), keys(kv[0]), keys(kv[1]), rows(out),
                                                        rows(lse), p.band);
          rows(dq).add_(g.dq);
          keys(dkv[0]).add_(g.dk);
          keys(dkv[1]).add_(g.dv);
        }
      } else if (part == Part::Diagonal || part == Part::FirstKeyChunk) {
        const int64_t keys = part == Part::Diagonal ? 2 * c : c;
        const BlockGradients g = attend_block_backward(grad_out, q, kv[0].narrow(2, 0, keys), kv[1].narrow(2, 0, keys),
                                                       out, lse, part == Part::Diagonal);
        dq.add_(g.dq);
        dkv[0].narrow(2, 0, keys).add_(g.dk);
        dkv[1].narrow(2, 0, keys).add_(g.dv);
      } else {
        const BlockGradients g =
            attend_block_backward(second(grad_out), second(q), kv[0], kv[1], second(out), second(lse), false);
        second(dq).add_(g.dq);
        dkv[0].add_(g.dk);
        dkv[1].add_(g.dv);
      }
      if (arriving_dkv) dkv.add_(arriving_dkv->take());
      // This block's dK/dV goes on with the block (after the last step: home to its owner),
      // overlapping the next block's backward.
      arriving_dkv.emplace(cp, dkv, kDkvTag + step);
      if (next) kv = next->take();
    }
    const at::Tensor own_dkv = arriving_dkv->take();
    return {dq.to(q.scalar_type()), own_dkv[0].to(k.scalar_type()), own_dkv[1].to(v.scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, comm::Communicator& cp,
                          int64_t window, const at::Tensor& documents) {
  if (cp.size() == 1) return causal_sdpa(q, k, v, window, documents);
  // A window as long as the whole sequence is plain causal attention.
  if (window >= q.size(2) * cp.size()) window = 0;
  if (documents.defined() && documents.size(1) != q.size(2) * cp.size())
    throw std::logic_error(fmt::format("ring attention: documents of {} positions for a sequence of {} tokens",
                                       documents.size(1), q.size(2) * cp.size()));
  return RingAttention::apply(q, k, v, DocumentIds{documents}, c10::make_intrusive<GroupHandle>(&cp), window);
}

}  // namespace trainer::parallel
