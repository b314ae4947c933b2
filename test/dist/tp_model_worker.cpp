// One rank of the tensor-parallel layer test: `tp_model_worker TIED SP` with RANK, WORLD_SIZE (the tp
// size), MASTER_ADDR and MASTER_PORT in the environment. Every rank builds the tensor-parallel
// model (its slices) and the whole single-process model (initialisation is global), in fp64, runs
// forward and backward of the same batch through both, and checks: the communication operators
// against their definitions, the loss, and every parameter gradient against the matching slice of
// the whole model's (with sequence parallelism, SP=1, the norm weights' gradients are partial sums
// over each rank's tokens, and the q/k norms' over each rank's heads: summed over tp first, as the
// gradient buckets do). The model has q/k/v biases, q/k norms and a sliding window in one layer;
// with sp it runs with the collective matmuls (parallel.tp_comm_overlap) and without. The collective
// matmuls are also checked alone against their definitions.
// Exit 0 when everything matches.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "model/transformer.h"
#include "parallel/tensor/collective_matmul.h"
#include "parallel/tensor/communication.h"
#include "expect_close.h"
#include "worker_groups.h"

using namespace trainer;

namespace {

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  test::expect_close(actual, expected, what, 1e-9, 1e-12);
}

// The operators against their definitions: values and gradients.
void check_operators(comm::Communicator& tp) {
  const int64_t n = tp.size(), r = tp.rank();
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  // Rank q holds q + 1 times a base tensor [2n, 3].
  const at::Tensor base = at::arange(6 * n, f64).view({2 * n, 3});
  auto mine = [&](int64_t q) { return base * double(q + 1); };
  const double total = double(n * (n + 1) / 2);

  at::Tensor x = mine(r).clone().requires_grad_(true);
  at::Tensor y = parallel::copy_to_tp(x, tp);
  (y * mine(r)).sum().backward();  // upstream gradient differs per rank; f sums it
  expect_close(y, mine(r), "copy_to_tp forward");
  expect_close(x.grad(), base * total, "copy_to_tp backward");

  x = mine(r).clone().requires_grad_(true);
  y = parallel::reduce_from_tp(x, tp);
  expect_close(y, base * total, "reduce_from_tp forward");
  y.sum().backward();
  expect_close(x.grad(), at::ones_like(base), "reduce_from_tp backward");

  const at::Tensor part = base.narrow(0, 2 * r, 2);
  x = (part * double(r + 1)).clone().requires_grad_(true);
  y = parallel::gather_from_sp(x, tp);  // [2n, 3]: rank q's chunk q, scaled by q + 1
  at::Tensor want = base.clone();
  for (int64_t q = 0; q < n; ++q) want.narrow(0, 2 * q, 2).mul_(double(q + 1));
  expect_close(y, want, "gather_from_sp forward");
  (y * mine(r)).sum().backward();  // backward reduce-scatters: chunk r of the sum over ranks
  expect_close(x.grad(), part * total, "gather_from_sp backward");

  x = mine(r).clone().requires_grad_(true);
  y = parallel::reduce_scatter_to_sp(x, tp);
  expect_close(y, part * total, "reduce_scatter_to_sp forward");
  (y * double(r + 1)).sum().backward();  // backward all-gathers every rank's upstream gradient
  want = at::ones_like(base);
  for (int64_t q = 0; q < n; ++q) want.narrow(0, 2 * q, 2).mul_(double(q + 1));
  expect_close(x.grad(), want, "reduce_scatter_to_sp backward");

  x = base.clone().requires_grad_(true);
  y = parallel::scatter_to_sp(x, tp);
  expect_close(y, part, "scatter_to_sp forward");
  (y * double(r + 1)).sum().backward();
  expect_close(x.grad(), want, "scatter_to_sp backward");
}

// Collective matmul (parallel/tensor/collective_matmul.h) against its definition, at odd sizes
// (3 sequence rows of 2 samples per rank, widths 5, 7 and 4): in fp64 close to the gathered
// product and to the summed products; in fp32 the gather's products equal an all-gather followed
// by one GEMM bit for bit (rows only regrouped), and at tp 2 so does the reduce-scatter (one
// addition per element, commutative).
void check_collective_matmul(comm::Communicator& tp) {
  const int64_t n = tp.size(), r = tp.rank();
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    const auto options = at::TensorOptions().dtype(dtype);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
    const at::Tensor all = at::randn({3 * n, 2, 5}, gen, options);  // every rank's chunk, rank order
    const at::Tensor w1 = at::randn({5, 7}, gen, options), w2 = at::randn({5, 4}, gen, options);
    const at::Tensor x = all.narrow(0, 3 * r, 3).clone();
    at::Tensor gathered;
    const auto outs = parallel::all_gather_matmul(x, {w1, w2}, tp, &gathered);
    const at::Tensor want1 = all.reshape({-1, 5}).mm(w1).view({3 * n, 2, 7});
    const at::Tensor want2 = all.reshape({-1, 5}).mm(w2).view({3 * n, 2, 4});
    // Every rank's rows times its own weight, summed over the ranks; rank r keeps its chunk.
    const at::Tensor local = all * double(r + 1);  // the rank's own [3n, 2, 5] input
    at::Tensor sum = at::zeros({3 * n, 2, 7}, options);
    for (int64_t q = 0; q < n; ++q) sum += (all * double(q + 1)).reshape({-1, 5}).mm(w1).view({3 * n, 2, 7});
    const at::Tensor reduced = parallel::matmul_reduce_scatter(local, w1, tp);
    const at::Tensor want_reduced = sum.narrow(0, 3 * r, 3);
    if (dtype == at::kDouble) {
      expect_close(outs[0], want1, "all_gather_matmul (first weight)");
      expect_close(outs[1], want2, "all_gather_matmul (second weight)");
      expect_close(reduced, want_reduced, "matmul_reduce_scatter");
    } else {
      // The unchunked path as the tp layers run it: an all-gather, then one GEMM per weight.
      at::Tensor total = at::empty({3 * n, 2, 5}, options);
      tp.all_gather(total, x)->wait();
      if (!at::equal(gathered, all) || !at::equal(total, all)) throw std::runtime_error("fp32: the gathered input differs");
      if (!at::equal(outs[0], total.reshape({-1, 5}).mm(w1).view({3 * n, 2, 7})) ||
          !at::equal(outs[1], total.reshape({-1, 5}).mm(w2).view({3 * n, 2, 4})))
        throw std::runtime_error("fp32: all_gather_matmul is not bit-identical to all-gather then GEMM");
      at::Tensor partial = local.reshape({-1, 5}).mm(w1).view({3 * n, 2, 7}), unchunked = at::empty({3, 2, 7}, options);
      tp.reduce_scatter(unchunked, partial, comm::ReduceOp::Sum)->wait();
      if (n == 2 && !at::equal(reduced, unchunked))
        throw std::runtime_error("fp32 tp 2: matmul_reduce_scatter is not bit-identical to GEMM then reduce-scatter");
      test::expect_close(reduced, unchunked, "fp32 matmul_reduce_scatter", 1e-5, 1e-5);
    }
  }
}

// The whole model and its tp-sharded copy (fp64) on the same tokens: equal loss, and every
// gradient equal to the whole model's slice once the replicated ones are summed over tp.
void check_model(const recipe::ModelConfig& c, comm::Communicator& tp, bool sp, bool overlap, const char* label) {
  model::ModelOptions options;
  options.config = c;
  options.seed = 9;
  options.dtype = at::kDouble;
  model::Transformer whole(options);
  options.tp = {tp.rank(), tp.size(), &tp, sp, overlap};
  model::Transformer sharded(options);

  // 12 positions: sequence parallelism splits them 2, 3 or 4 ways.
  at::Tensor tokens = at::randint(c.vocab_size, {2, 13}, at::make_generator<at::CPUGeneratorImpl>(4),
                                  at::TensorOptions().dtype(at::kLong));
  at::Tensor targets = tokens.narrow(1, 1, 12).clone();
  targets.index_put_({0, 3}, model::kIgnoreIndex);  // an ignored target
  const at::Tensor inputs = tokens.narrow(1, 0, 12);
  const auto full = whole.forward(inputs, targets);
  const auto part = sharded.forward(inputs, targets);
  expect_close(part.loss_sum.to(at::kDouble), full.loss_sum.to(at::kDouble), "loss");
  full.loss_sum.backward();
  part.loss_sum.backward();
  int64_t over_tp = 0, padding_rows = 0;
  for (const auto& p : sharded.parameters().all()) {
    const model::Parameter* q = whole.parameters().find(p.name);
    if (!q) throw std::runtime_error("no parameter " + p.name + " in the whole model");
    // Summed over tp: the norms sequence parallelism leaves replicated, the q/k norms always, and
    // MLA's replicated down-projections and latent norms always.
    const bool per_head_work = p.name.find("q_norm") != std::string::npos || p.name.find("k_norm") != std::string::npos ||
                               p.name.find("_a_proj") != std::string::npos || p.name.find("_a_layernorm") != std::string::npos;
    if ((p.grad_group == mesh::GroupKind::TpDpCp) != ((sp && p.shards.empty()) || per_head_work))
      throw std::runtime_error(p.name + ": reduced over tp exactly when it is replicated and sees part of the work");
    if (p.grad_group == mesh::GroupKind::TpDpCp) {
      tp.all_reduce(p.tensor.mutable_grad(), comm::ReduceOp::Sum)->wait();
      ++over_tp;
    }
    at::Tensor expected = q->real_part(q->grad());
    for (const auto& shard : p.shards) expected = expected.narrow(shard.dim, shard.offset, shard.length);
    expect_close(p.real_part(p.grad()), expected, "gradient of " + p.name);
    // Padding rows stay zero: no gradient reaches them.
    const int64_t padding = p.shards.empty() ? 0 : p.shards[0].padding;
    if (padding > 0 && !at::equal(p.grad().narrow(0, p.shards[0].length, padding),
                                  at::zeros_like(p.grad().narrow(0, p.shards[0].length, padding))))
      throw std::runtime_error(p.name + ": padding rows have a gradient");
    padding_rows += padding;
  }
  std::printf(
      "rank %lld: %s: tp %lld tied %d sp %d overlap %d vocab %lld padded to %lld: loss %.12g, %zu gradients match (%lld summed "
      "over tp, %lld padding rows)\n",
      (long long)tp.rank(), label, (long long)tp.size(), int(c.tie_word_embeddings), int(sp), int(overlap),
      (long long)c.vocab_size,
      (long long)c.padded_vocab_size(tp.size()), part.loss_sum.item<double>(), sharded.parameters().all().size(),
      (long long)over_tp, (long long)padding_rows);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 4) throw std::runtime_error("usage: tp_model_worker TIED SP VOCAB_DIVISOR");
    const bool tied = std::atoi(argv[1]) != 0;
    const bool sp = std::atoi(argv[2]) != 0;
    const int64_t divisor = std::atoll(argv[3]);
    const int64_t world = std::atoll(std::getenv("WORLD_SIZE"));
    recipe::MeshShape s;
    s.world_size = s.tp = s.etp = world;
    const auto owned = test::worker_groups(s);
    mesh::ProcessGroups& groups = *owned;
    comm::Communicator& tp = groups.get(mesh::GroupKind::Tp);
    check_operators(tp);
    check_collective_matmul(tp);

    // Heads, key/value heads and the MLP split by the tp size; the vocabulary is padded: with divisor
    // 1 the last rank holds tp - 1 padding rows, with 128 the first rank holds every real row and
    // the others padding only.
    recipe::ModelConfig c;
    c.vocab_size = 30 * world + 1;
    c.make_vocab_size_divisible_by = divisor;
    c.hidden_size = 12;
    c.intermediate_size = 10 * world;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 2 * world;
    c.num_key_value_heads = world;
    c.head_dim = 4;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = tied;
    c.initializer_range = 0.2;
    // The families' attention features: Qwen2's q/k/v biases (split with their heads), Qwen3's
    // per-head q/k norms (replicated, gradients summed over tp), and a sliding window of 5 of the
    // 12 positions in layer 1.
    c.attention_bias = true;
    c.qk_norm = true;
    c.sliding_window = 5;
    c.sliding_window_layers = {1};
    // With sp, the linears' collectives as collective matmuls (parallel.tp_comm_overlap) and not.
    for (const bool overlap : sp ? std::vector<bool>{true, false} : std::vector<bool>{false})
      check_model(c, tp, sp, overlap, "gqa with biases, q/k norms and a window");
    // DeepSeek's latent attention: heads split, the down-projections and latent norms replicated
    // (their gradients summed over tp), YaRN's softmax scale; with the tied embedding, no query latent.
    recipe::ModelConfig mla = c;
    mla.attention_bias = false;
    mla.qk_norm = false;
    mla.sliding_window.reset();
    mla.sliding_window_layers.clear();
    mla.num_key_value_heads = mla.num_attention_heads;
    mla.mla = recipe::MlaConfig{};
    mla.mla->q_lora_rank = tied ? std::nullopt : std::optional<int64_t>(7);
    mla.mla->kv_lora_rank = 6;
    mla.mla->qk_nope_head_dim = 3;
    mla.mla->qk_rope_head_dim = 4;
    mla.mla->v_head_dim = 5;
    mla.mla->rope_interleave = !tied;
    recipe::RopeScaling yarn;
    yarn.rope_type = recipe::RopeType::Yarn;
    yarn.factor = 2.0;
    yarn.original_max_position_embeddings = 8;
    yarn.mscale = 1.0;
    yarn.mscale_all_dim = 1.0;
    mla.rope_scaling = yarn;
    check_model(mla, tp, sp, /*overlap=*/sp, "latent attention");
    groups.world().barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tp_model_worker: %s\n", e.what());
    return 1;
  }
}
