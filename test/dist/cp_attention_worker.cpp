// One rank of the context-parallel attention test: `cp_attention_worker METHOD DTYPE` (METHOD ring
// or ulysses, DTYPE f32 or f64) with RANK, WORLD_SIZE (the cp size), MASTER_ADDR and MASTER_PORT in
// the environment. Every rank draws the same whole-sequence q, k, v (grouped-query: more query
// heads than key/value heads) and upstream gradient, runs causal attention on the whole sequence
// (and sliding-window attention, windows from 1 token to the sequence less one; and with document
// masking, documents of 1 token, across chunk boundaries and nearly the whole sequence, with and
// without a window) as the reference, and runs its zigzag part through ring or Ulysses attention;
// the output and the gradients of q, k and v must equal the reference's zigzag part. Ring
// attention with documents also runs on the sequence reordered by parallel::document_layout (as
// training reorders it), against the reference reordered the same way. Prints the largest
// differences relative to the largest reference value of the four tensors; exit 0 when they are within
// the tolerance (fp32 1e-6, fp64 1e-12).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "parallel/context/document_layout.h"
#include "parallel/context/ring_attention.h"
#include "parallel/context/ulysses_attention.h"
#include "parallel/context/zigzag.h"
#include "worker_groups.h"

using namespace trainer;

int main(int argc, char** argv) {
  try {
    if (argc != 3) throw std::runtime_error("usage: cp_attention_worker ring|ulysses f32|f64");
    const bool ring = std::strcmp(argv[1], "ring") == 0;
    const bool f64 = std::strcmp(argv[2], "f64") == 0;
    const int64_t world = std::atoll(std::getenv("WORLD_SIZE"));
    recipe::MeshShape s;
    s.world_size = s.cp = s.edp = world;  // experts: every rank is an expert-data replica
    const auto owned = test::worker_groups(s);
    comm::Communicator& cp = owned->get(mesh::GroupKind::Cp);
    const int64_t n = cp.size(), r = cp.rank();

    // Chunks of 3 tokens (odd); 6 query heads at cp 3 (Ulysses splits heads), else 4; 2 kv heads.
    const int64_t batch = 2, heads = n == 3 ? 6 : 4, kv_heads = 2, seq = 2 * n * 3, dim = 8;
    const auto options = at::TensorOptions().dtype(f64 ? at::kDouble : at::kFloat);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(17);
    const at::Tensor q = at::randn({batch, heads, seq, dim}, generator, options);
    const at::Tensor k = at::randn({batch, kv_heads, seq, dim}, generator, options);
    const at::Tensor v = at::randn({batch, kv_heads, seq, dim}, generator, options);
    const at::Tensor grad = at::randn({batch, heads, seq, dim}, generator, options);

    // Full causal attention (window 0), and sliding windows inside one chunk of 3 tokens, across
    // one or two chunk boundaries, and one token short of the sequence.
    const double tolerance = f64 ? 1e-12 : 1e-6;
    double worst = 0;
    std::string report;
    // Documents: sample 0 lengths 1, 5, 1, 2 and the rest; sample 1 the whole but the last two tokens,
    // then 1 and 1. Chunks are 3 tokens: documents cross chunk boundaries and zigzag halves.
    std::vector<int64_t> document_ids;
    for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{1, 5, 1, 2, seq - 9}, {seq - 2, 1, 1}})
      for (size_t d = 0; d < lengths.size(); ++d) document_ids.insert(document_ids.end(), size_t(lengths[d]), int64_t(d));
    const at::Tensor ids = at::tensor(document_ids, at::kLong).view({batch, seq});
    struct Case {
      int64_t window;
      bool documents, reordered;
    };
    std::vector<Case> cases;
    for (const int64_t window : {int64_t(0), int64_t(1), int64_t(2), int64_t(4), int64_t(7), seq - 1})
      cases.push_back({window, false, false});
    // A window of 2 leaves some queries of a document's part no key in its part of another chunk
    // (they attend only keys of their own part, merged after).
    for (const int64_t window : {int64_t(0), int64_t(2), int64_t(4)}) cases.push_back({window, true, false});
    if (ring)
      for (const int64_t window : {int64_t(0), int64_t(2), int64_t(4)}) cases.push_back({window, true, true});
    const at::Tensor layout = parallel::document_layout(ids, n);  // [B, T]
    for (const auto [window, documents, reordered] : cases) {
      const at::Tensor q_all = q.clone().requires_grad_(true), k_all = k.clone().requires_grad_(true),
                       v_all = v.clone().requires_grad_(true);
      at::Tensor full;
      if (documents) {
        const at::Tensor i = at::arange(seq).unsqueeze(1), j = at::arange(seq).unsqueeze(0);
        at::Tensor allowed = (i - j).ge(0);
        if (window > 0) allowed = allowed.logical_and((i - j).lt(window));
        allowed = allowed.logical_and(ids.unsqueeze(2) == ids.unsqueeze(1)).unsqueeze(1);  // [B, 1, T, T]
        full = at::scaled_dot_product_attention(q_all, k_all, v_all, allowed, 0.0, false, std::nullopt,
                                                /*enable_gqa=*/true);
      } else if (window == 0) {
        full = at::scaled_dot_product_attention(q_all, k_all, v_all, {}, 0.0, true, std::nullopt, /*enable_gqa=*/true);
      } else {
        // Query i attends key j when 0 <= i - j < window (transformers' sliding window).
        const at::Tensor i = at::arange(seq).unsqueeze(1), j = at::arange(seq).unsqueeze(0);
        const at::Tensor allowed = (i - j).ge(0).logical_and((i - j).lt(window));
        full = at::scaled_dot_product_attention(q_all, k_all, v_all, allowed, 0.0, false, std::nullopt,
                                                /*enable_gqa=*/true);
      }
      full.backward(grad);

      // [B, heads, T, d] in the reordered sequence's order, when the case reorders.
      auto order = [&](const at::Tensor& x) {
        return reordered ? x.gather(2, layout.view({batch, 1, seq, 1}).expand(x.sizes())) : x;
      };
      auto part = [&](const at::Tensor& x) { return parallel::zigzag_take(order(x), 2, n, r).contiguous(); };
      const at::Tensor q_part = part(q).requires_grad_(true), k_part = part(k).requires_grad_(true),
                       v_part = part(v).requires_grad_(true);
      const at::Tensor whole_ids = !documents ? at::Tensor() : reordered ? ids.gather(1, layout) : ids;
      const at::Tensor out = ring ? parallel::ring_attention(q_part, k_part, v_part, cp, window, whole_ids)
                                  : parallel::ulysses_attention(q_part, k_part, v_part, cp, window, whole_ids);
      out.backward(part(grad));

      report += fmt::format(" window {}{}:", window, reordered ? " documents reordered" : documents ? " documents" : "");
      const std::vector<std::tuple<std::string, at::Tensor, at::Tensor>> compared = {
          {"out", out, part(full.detach())},
          {"dq", q_part.grad(), part(q_all.grad())},
          {"dk", k_part.grad(), part(k_all.grad())},
          {"dv", v_part.grad(), part(v_all.grad())}};
      // The scale: the largest reference value of the four tensors (with a window of one token dq
      // and dk are zero up to rounding, so their own largest value is rounding noise).
      double scale = 0;
      for (const auto& [name, actual, expected] : compared) scale = std::max(scale, expected.abs().max().item<double>());
      for (const auto& [name, actual, expected] : compared) {
        if (!actual.defined() || !actual.sizes().equals(expected.sizes()))
          throw std::runtime_error(name + ": missing or of the wrong shape");
        const double difference = (actual - expected).abs().max().item<double>() / scale;
        if (!(difference <= worst)) worst = difference;  // NaN too
        report += fmt::format(" {} {:.3g}", name, difference);
      }
    }
    std::printf("rank %lld: %s cp %lld %s, largest relative differences:%s\n", (long long)r, argv[1], (long long)n, argv[2],
                report.c_str());
    owned->world().barrier();
    if (!(worst <= tolerance)) throw std::runtime_error(fmt::format("difference {} above {}", worst, tolerance));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cp_attention_worker: %s\n", e.what());
    return 1;
  }
}
