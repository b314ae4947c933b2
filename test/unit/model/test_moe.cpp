// MoE routing, capacity, shared experts and the load-balancing loss against hand-computed values,
// and the layer's gradient against central differences.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "model/moe.h"
#include "model/routing_bias.h"
#include "model_test_util.h"

using namespace trainer;
using model_test::max_relative_error;
using model_test::param;

TEST_CASE("load_balancing_loss is N_E times sum_i f_i P_i on a hand-made routing", "[model][moe]") {
  // 4 tokens, 2 experts. P = column means = (0.7+0.6+0.2+0.9)/4 = 0.6 and 0.4.
  const at::Tensor probs =
      at::tensor({0.7, 0.3, 0.6, 0.4, 0.2, 0.8, 0.9, 0.1}, at::kFloat).view({4, 2}).requires_grad_(true);
  SECTION("top-1") {
    // chosen 0, 0, 1, 0: f = (3/4, 1/4); loss = 2 * (0.75*0.6 + 0.25*0.4) = 1.1.
    const at::Tensor chosen = at::tensor({0, 0, 1, 0}, at::kLong).view({4, 1});
    const at::Tensor loss = model::load_balancing_loss(probs, chosen, 2);
    CHECK(loss.dim() == 0);
    CHECK(loss.scalar_type() == at::kFloat);
    CHECK(loss.item<double>() == Approx(1.1).epsilon(1e-6));
    // The counts carry no gradient: d loss / d probs[n][i] = N_E * f_i / N.
    loss.backward();
    const at::Tensor g = probs.grad();
    for (int n = 0; n < 4; ++n) {
      CHECK(g[n][0].item<double>() == Approx(2 * 0.75 / 4).epsilon(1e-6));
      CHECK(g[n][1].item<double>() == Approx(2 * 0.25 / 4).epsilon(1e-6));
    }
  }
  SECTION("top-2 over two experts: every token picks both, f = 1/2") {
    const at::Tensor chosen = at::tensor({0, 1, 1, 0, 1, 0, 0, 1}, at::kLong).view({4, 2});
    CHECK(model::load_balancing_loss(probs, chosen, 2).item<double>() == Approx(2 * (0.5 * 0.6 + 0.5 * 0.4)));
  }
  SECTION("an unbalanced routing with 3 experts, one never chosen") {
    const at::Tensor p3 = at::tensor({0.5, 0.3, 0.2, 0.1, 0.6, 0.3}, at::kFloat).view({2, 3});
    const at::Tensor chosen = at::tensor({0, 1}, at::kLong).view({2, 1});
    // f = (1/2, 1/2, 0), P = (0.3, 0.45, 0.25): 3 * (0.15 + 0.225) = 1.125.
    CHECK(model::load_balancing_loss(p3, chosen, 3).item<double>() == Approx(1.125).epsilon(1e-6));
  }
}

TEST_CASE("perfectly balanced routing gives a load-balancing loss of 1", "[model][moe]") {
  for (int64_t experts : {2, 4, 8}) {
    CAPTURE(experts);
    const int64_t tokens = 2 * experts;
    const at::Tensor probs = at::full({tokens, experts}, 1.0 / double(experts), at::kFloat);
    const at::Tensor chosen = at::arange(tokens, at::kLong).remainder(experts).view({tokens, 1});
    CHECK(model::load_balancing_loss(probs, chosen, experts).item<double>() == Approx(1.0).epsilon(1e-6));
    // Top-2, each expert chosen equally often.
    const at::Tensor chosen2 =
        at::stack({at::arange(tokens, at::kLong).remainder(experts), (at::arange(tokens, at::kLong) + 1).remainder(experts)}, 1);
    CHECK(model::load_balancing_loss(probs, chosen2, experts).item<double>() == Approx(1.0).epsilon(1e-6));
  }
}

namespace {

constexpr int64_t kHidden = 6, kExperts = 4, kTokens = 6;

recipe::ModelConfig moe_config(int64_t top_k, int64_t shared, std::optional<double> capacity,
                               recipe::AuxLossScope scope = recipe::AuxLossScope::MicroBatch) {
  recipe::ModelConfig c;
  c.hidden_size = kHidden;
  recipe::MoeConfig moe;
  moe.num_local_experts = kExperts;
  moe.num_experts_per_tok = top_k;
  moe.moe_intermediate_size = 5;
  moe.num_shared_experts = shared;
  moe.capacity_factor = capacity;
  moe.aux_loss_scope = scope;
  c.moe = moe;
  return c;
}

const std::string kPrefix = "model.layers.0.block_sparse_moe.";

// Token t leans on expert primary[t] (router logit 10) and then secondary[t] (logit 5); the router
// does not see the last two hidden dimensions.
const std::vector<int64_t> primary = {0, 1, 0, 2, 0, 0};
const std::vector<int64_t> secondary = {1, 2, 3, 0, 3, 1};

at::Tensor routed_tokens() {
  at::Tensor x = at::zeros({kTokens, kHidden}, at::kDouble);
  const at::Tensor noise = model_test::randn({kTokens, 2}, 17);
  for (int64_t t = 0; t < kTokens; ++t) {
    x[t][primary[t]] = 1.0;
    x[t][secondary[t]] = 0.5;
    x[t].narrow(0, 4, 2).copy_(noise[t]);
  }
  return x.view({2, 3, kHidden});  // [B, T, hidden]: the layer flattens tokens in order
}

struct MoeLayer {
  model::ParameterSet params;
  model::Moe moe;
  MoeLayer(int64_t top_k, int64_t shared, std::optional<double> capacity, bool known_router = true,
           recipe::AuxLossScope scope = recipe::AuxLossScope::MicroBatch)
      : params(model::ParameterOptions{21, 0.5, at::kDouble}) {
    moe = model::Moe(params, kPrefix, moe_config(top_k, shared, capacity, scope), {});
    if (known_router) {
      at::NoGradGuard no_grad;
      at::Tensor w = param(params, kPrefix + "gate.weight");  // [E, hidden]
      w.zero_();
      for (int64_t e = 0; e < kExperts; ++e) w[e][e] = 10.0;
    }
  }
  at::Tensor swiglu(const std::string& prefix, const std::string& gate, const std::string& up,
                    const std::string& down, const at::Tensor& x) const {
    const at::Tensor g = at::matmul(x, param(params, prefix + gate).t());
    const at::Tensor u = at::matmul(x, param(params, prefix + up).t());
    return at::matmul(g * at::sigmoid(g) * u, param(params, prefix + down).t());
  }
  at::Tensor expert(int64_t e, const at::Tensor& x) const {
    return swiglu(kPrefix + "experts." + std::to_string(e) + ".", "w1.weight", "w3.weight", "w2.weight", x);
  }
};

// Reference routing: softmax of the router logits in double, top-k written out, weights renormalised,
// and with a capacity each expert keeps its highest-probability copies (ties: earlier token).
struct Reference {
  at::Tensor output, probs, chosen;
  std::vector<int64_t> tokens_per_expert;
};

Reference reference(const MoeLayer& layer, const at::Tensor& x3, int64_t top_k, std::optional<double> capacity) {
  const at::Tensor x = x3.reshape({-1, kHidden});
  const int64_t n = x.size(0);
  const at::Tensor probs = at::softmax(at::matmul(x, param(layer.params, kPrefix + "gate.weight").t()), -1);
  const int64_t cap = capacity ? int64_t(std::ceil(*capacity * double(n * top_k) / kExperts)) : n * top_k;
  Reference r;
  r.probs = probs;
  r.chosen = at::zeros({n, top_k}, at::kLong);
  r.tokens_per_expert.assign(kExperts, 0);
  std::vector<std::vector<std::pair<double, int64_t>>> ranked(static_cast<size_t>(n));
  std::vector<std::vector<std::pair<double, int64_t>>> copies(static_cast<size_t>(kExperts));  // (-probability, token) per expert
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < kExperts; ++e) ranked[t].push_back({probs[t][e].item<double>(), e});
    std::sort(ranked[t].rbegin(), ranked[t].rend());
    for (int64_t j = 0; j < top_k; ++j) {
      r.chosen[t][j] = ranked[t][j].second;
      copies[ranked[t][j].second].push_back({-ranked[t][j].first, t});
    }
  }
  std::set<std::pair<int64_t, int64_t>> kept;  // (token, expert)
  for (int64_t e = 0; e < kExperts; ++e) {
    std::sort(copies[e].begin(), copies[e].end());
    for (int64_t i = 0; i < std::min<int64_t>(cap, copies[e].size()); ++i) kept.insert({copies[e][i].second, e});
  }
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < n; ++t) {
    double total = 0;
    for (int64_t j = 0; j < top_k; ++j) total += ranked[t][j].first;
    at::Tensor row = at::zeros({kHidden}, at::kDouble);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = ranked[t][j].second;
      if (!kept.count({t, e})) continue;
      ++r.tokens_per_expert[e];
      row = row + ranked[t][j].first / total * layer.expert(e, x[t].unsqueeze(0))[0];
    }
    rows.push_back(row);
  }
  r.output = at::stack(rows).view(x3.sizes());
  return r;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

double hand_aux_loss(const at::Tensor& probs, const at::Tensor& chosen) {
  const int64_t n = probs.size(0), k = chosen.size(1);
  double loss = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const double f = double((chosen == e).sum().item<int64_t>()) / double(n * k);
    loss += f * probs.select(1, e).mean().item<double>();
  }
  return kExperts * loss;
}

}  // namespace

TEST_CASE("Moe routes each token to its known top-k experts and mixes their SwiGLU outputs", "[model][moe]") {
  const at::Tensor x = routed_tokens();
  SECTION("top-1") {
    MoeLayer layer(1, 0, std::nullopt);
    const model::MoeOutput out = layer.moe.forward(x);
    CHECK(to_vector(out.tokens_per_expert) == std::vector<int64_t>{4, 1, 1, 0});
    CHECK(out.output.sizes() == x.sizes());
    CHECK(out.output.scalar_type() == at::kDouble);
    // Top-1: the weight is 1, the output is the primary expert's.
    const at::Tensor flat = x.view({-1, kHidden}), y = out.output.view({-1, kHidden});
    for (int64_t t = 0; t < kTokens; ++t)
      CHECK(max_relative_error(y[t], layer.expert(primary[t], flat[t].unsqueeze(0))[0]) < 1e-6);
    const Reference ref = reference(layer, x, 1, std::nullopt);
    CHECK(to_vector(ref.chosen.view({-1})) == primary);
    CHECK(max_relative_error(out.output, ref.output) < 1e-12);
    CHECK(out.aux_loss.scalar_type() == at::kFloat);
    CHECK(out.aux_loss.item<double>() == Approx(hand_aux_loss(ref.probs, ref.chosen)).epsilon(1e-6));
  }
  SECTION("top-2") {
    MoeLayer layer(2, 0, std::nullopt);
    const model::MoeOutput out = layer.moe.forward(x);
    // Expert 0: tokens 0, 2, 3, 4, 5; expert 1: 0, 1, 5; expert 2: 1, 3; expert 3: 2, 4.
    CHECK(to_vector(out.tokens_per_expert) == std::vector<int64_t>{5, 3, 2, 2});
    const Reference ref = reference(layer, x, 2, std::nullopt);
    for (int64_t t = 0; t < kTokens; ++t) {
      CHECK(ref.chosen[t][0].item<int64_t>() == primary[t]);
      CHECK(ref.chosen[t][1].item<int64_t>() == secondary[t]);
    }
    // Token 0 by hand: probabilities of experts 0 and 1 renormalised over the pair.
    const at::Tensor x0 = x.view({-1, kHidden})[0].unsqueeze(0);
    const double p0 = ref.probs[0][0].item<double>(), p1 = ref.probs[0][1].item<double>();
    const at::Tensor y0 = p0 / (p0 + p1) * layer.expert(0, x0)[0] + p1 / (p0 + p1) * layer.expert(1, x0)[0];
    // The router's softmax runs in fp32 (as in Hugging Face Mixtral), so weights are fp32-accurate.
    CHECK(max_relative_error(out.output.view({-1, kHidden})[0], y0) < 1e-6);
    CHECK(max_relative_error(out.output, ref.output) < 1e-6);
    CHECK(out.aux_loss.item<double>() == Approx(hand_aux_loss(ref.probs, ref.chosen)).epsilon(1e-6));
  }
}

TEST_CASE("capacity_factor keeps each expert's highest-scoring copies with ties in token order", "[model][moe]") {
  const at::Tensor x = routed_tokens();
  const at::Tensor flat = x.view({-1, kHidden});
  SECTION("top-1, factor 1: capacity ceil(6/4) = 2") {
    MoeLayer layer(1, 0, 1.0);
    const model::MoeOutput out = layer.moe.forward(x);
    CHECK(to_vector(out.tokens_per_expert) == std::vector<int64_t>{2, 1, 1, 0});
    const at::Tensor y = out.output.view({-1, kHidden});
    // Expert 0 keeps tokens 0 and 2; tokens 4 and 5 are dropped and get a zero output.
    CHECK(max_relative_error(y[2], layer.expert(0, flat[2].unsqueeze(0))[0]) < 1e-6);
    CHECK(at::equal(y[4], at::zeros({kHidden}, at::kDouble)));
    CHECK(at::equal(y[5], at::zeros({kHidden}, at::kDouble)));
    CHECK(max_relative_error(y[3], layer.expert(2, flat[3].unsqueeze(0))[0]) < 1e-6);
    CHECK(max_relative_error(out.output, reference(layer, x, 1, 1.0).output) < 1e-12);
  }
  SECTION("top-1, factor 2: capacity 3") {
    MoeLayer layer(1, 0, 2.0);
    const model::MoeOutput out = layer.moe.forward(x);
    CHECK(to_vector(out.tokens_per_expert) == std::vector<int64_t>{3, 1, 1, 0});
    CHECK(at::equal(out.output.view({-1, kHidden})[5], at::zeros({kHidden}, at::kDouble)));
    CHECK(out.output.view({-1, kHidden})[4].abs().sum().item<double>() > 0);
  }
  SECTION("top-2, factor 1: capacity ceil(12/4) = 3") {
    MoeLayer layer(2, 0, 1.0);
    const model::MoeOutput out = layer.moe.forward(x);
    // Expert 0 is the first choice of tokens 0, 2, 4, 5 and the second of token 3: it keeps the
    // first choices 0, 2, 4 (higher probability, then token order) and drops 5 and 3.
    CHECK(to_vector(out.tokens_per_expert) == std::vector<int64_t>{3, 3, 2, 2});
    const Reference ref = reference(layer, x, 2, 1.0);
    CHECK(ref.tokens_per_expert == std::vector<int64_t>{3, 3, 2, 2});
    // Token 5 keeps only its second expert (1), with its unrenormalised top-2 weight.
    const double p0 = ref.probs[5][0].item<double>(), p1 = ref.probs[5][1].item<double>();
    CHECK(max_relative_error(out.output.view({-1, kHidden})[5],
                             p1 / (p0 + p1) * layer.expert(1, flat[5].unsqueeze(0))[0]) < 1e-6);
    // Token 3 loses its second expert (0) though it comes before token 4: the score decides.
    const double q2 = ref.probs[3][2].item<double>(), q0 = ref.probs[3][0].item<double>();
    CHECK(max_relative_error(out.output.view({-1, kHidden})[3],
                             q2 / (q2 + q0) * layer.expert(2, flat[3].unsqueeze(0))[0]) < 1e-6);
    CHECK(max_relative_error(out.output, ref.output) < 1e-6);
    // The auxiliary loss counts the routing before capacity.
    CHECK(out.aux_loss.item<double>() == Approx(hand_aux_loss(ref.probs, ref.chosen)).epsilon(1e-6));
  }
}

TEST_CASE("shared experts add their output for every token", "[model][moe]") {
  const at::Tensor x = routed_tokens();
  MoeLayer routed(2, 0, std::nullopt), with_shared(2, 2, std::nullopt);
  const std::string shared = kPrefix + "shared_experts.";
  // Two shared experts are one SwiGLU of width 2 * 5 (the routed experts are the same tensors).
  CHECK(param(with_shared.params, shared + "gate_proj.weight").sizes().vec() == std::vector<int64_t>{10, kHidden});
  CHECK(at::equal(param(routed.params, kPrefix + "experts.3.w2.weight"),
                  param(with_shared.params, kPrefix + "experts.3.w2.weight")));
  const model::MoeOutput a = routed.moe.forward(x), b = with_shared.moe.forward(x);
  CHECK(at::equal(a.tokens_per_expert, b.tokens_per_expert));
  const at::Tensor expected =
      a.output + with_shared.swiglu(shared, "gate_proj.weight", "up_proj.weight", "down_proj.weight", x);
  CHECK(max_relative_error(b.output, expected) < 1e-12);
  // With a capacity, a dropped token still gets the shared experts' output.
  MoeLayer capped(1, 1, 1.0);
  const at::Tensor y = capped.moe.forward(x).output.view({-1, kHidden});
  const at::Tensor shared5 =
      capped.swiglu(shared, "gate_proj.weight", "up_proj.weight", "down_proj.weight", x.view({-1, kHidden})[5]);
  CHECK(max_relative_error(y[5], shared5) < 1e-12);
}

TEST_CASE("Moe gradients match central differences with the routing held fixed", "[model][moe]") {
  for (int64_t top_k : {1, 2}) {
    CAPTURE(top_k);
    MoeLayer layer(top_k, 1, std::nullopt, /*known_router=*/false);
    const at::Tensor x = model_test::randn({2, 4, kHidden}, 31).requires_grad_(true);
    const at::Tensor g = model_test::randn({2, 4, kHidden}, 32);
    // The routing must not flip under the perturbations: a margin between the k-th and the
    // (k+1)-th router probability of every token, and the same chosen experts at every evaluation.
    const auto router_probs = [&] {
      at::NoGradGuard no_grad;
      return at::softmax(at::matmul(x.view({-1, kHidden}), param(layer.params, kPrefix + "gate.weight").t()), -1);
    };
    const at::Tensor sorted = std::get<0>(router_probs().sort(-1, /*descending=*/true));
    REQUIRE((sorted.select(1, top_k - 1) - sorted.select(1, top_k)).min().item<double>() > 1e-2);
    const at::Tensor chosen = std::get<1>(router_probs().topk(top_k, -1));
    const model::MoeOutput base = layer.moe.forward(x);
    const auto loss_of = [&] {
      REQUIRE(at::equal(std::get<1>(router_probs().topk(top_k, -1)), chosen));
      const model::MoeOutput out = layer.moe.forward(x);
      REQUIRE(at::equal(out.tokens_per_expert, base.tokens_per_expert));
      return ((out.output * g).sum() + 0.5 * out.aux_loss.to(at::kDouble)).item<double>();
    };
    model_test::clear_grads(layer.params);
    ((base.output * g).sum() + 0.5 * base.aux_loss.to(at::kDouble)).backward();

    // Expert weights: the routing is untouched and everything they touch is double: tight.
    std::vector<std::string> expert_names = {kPrefix + "shared_experts.up_proj.weight"};
    for (int64_t e = 0; e < kExperts; ++e) {
      if (base.tokens_per_expert[e].item<int64_t>() == 0) continue;
      for (const char* w : {"w1", "w2", "w3"})
        expert_names.push_back(kPrefix + "experts." + std::to_string(e) + "." + w + ".weight");
    }
    for (const auto& name : expert_names) {
      const at::Tensor w = param(layer.params, name);
      REQUIRE(w.grad().defined());
      for (int64_t index : {int64_t(0), w.numel() / 2 + 1, w.numel() - 1}) {
        CAPTURE(name, index);
        const double fd = model_test::central_difference4(w, index, 1e-3, loss_of);
        CHECK(w.grad().view({-1})[index].item<double>() == Approx(fd).epsilon(1e-8).margin(1e-10));
      }
    }
    // The input and the router pass through the router softmax and the auxiliary loss, both fp32
    // even in a double model (Hugging Face Mixtral's choice): a larger step, and a tolerance for
    // fp32 rounding (measured worst error 1e-5 absolute).
    const at::Tensor gate = param(layer.params, kPrefix + "gate.weight");
    for (const auto& [w, name] : std::vector<std::pair<at::Tensor, std::string>>{{x, "x"}, {gate, "gate"}}) {
      for (int64_t index : {int64_t(0), int64_t(7), w.numel() - 1}) {
        CAPTURE(name, index);
        const double fd = model_test::central_difference4(w, index, 1e-2, loss_of);
        CHECK(w.grad().view({-1})[index].item<double>() == Approx(fd).epsilon(1e-3).margin(1e-4));
      }
    }
  }
}

TEST_CASE("the router z-loss and the top-k margin and the per-step load statistics", "[model][moe]") {
  MoeLayer layer(2, 0, std::nullopt, /*known_router=*/false);
  const at::Tensor x = model_test::randn({2, 5, kHidden}, 41);
  const at::Tensor logits = at::matmul(x.view({-1, kHidden}), param(layer.params, kPrefix + "gate.weight").t());
  const at::Tensor probs = at::softmax(logits.to(at::kFloat), -1);
  const at::Tensor sorted = std::get<0>(probs.sort(-1, /*descending=*/true));
  layer.moe.step_state().reset();
  const model::MoeOutput out = layer.moe.forward(x);
  const at::Tensor lse = at::logsumexp(logits, {-1});
  CHECK(out.z_loss.item<double>() == Approx((lse * lse).mean().item<double>()).epsilon(1e-6));
  const model::MoeStepState& s = layer.moe.step_state();
  CHECK(s.min_margin.item<double>() == Approx((sorted.select(1, 1) - sorted.select(1, 2)).min().item<double>()));
  CHECK(s.tokens_per_expert.sum().item<double>() == 20);
  layer.moe.forward(x);
  CHECK(s.tokens_per_expert.sum().item<double>() == 40);  // accumulated over the step's micro-batches
  layer.moe.step_state().reset();
  CHECK(!s.tokens_per_expert.defined());
}

TEST_CASE("global_batch scope: frequencies accumulate over the step's micro-batches", "[model][moe]") {
  MoeLayer layer(2, 0, std::nullopt, /*known_router=*/false, recipe::AuxLossScope::GlobalBatch);
  const at::Tensor a = model_test::randn({2, 4, kHidden}, 51), b = model_test::randn({2, 4, kHidden}, 52);
  const auto probs_of = [&](const at::Tensor& x) {
    return at::softmax(at::matmul(x.view({-1, kHidden}), param(layer.params, kPrefix + "gate.weight").t()).to(at::kFloat), -1);
  };
  const auto counts_of = [&](const at::Tensor& x) {
    return at::bincount(std::get<1>(probs_of(x).topk(2, -1)).reshape({-1}), {}, kExperts).to(at::kDouble);
  };
  layer.moe.step_state().reset();
  const model::MoeOutput first = layer.moe.forward(a);
  const model::MoeOutput second = layer.moe.forward(b);
  // First micro-batch: its own counts; second: the mean of both micro-batches' counts.
  CHECK(first.aux_loss.item<double>() == Approx(model::load_balancing_loss(probs_of(a), std::get<1>(probs_of(a).topk(2, -1)), kExperts).item<double>()).epsilon(1e-6));
  const at::Tensor f = (counts_of(a) + counts_of(b)) / 2 / double(8 * 2);
  const double expected = kExperts * (f * probs_of(b).to(at::kDouble).mean(0)).sum().item<double>();
  CHECK(second.aux_loss.item<double>() == Approx(expected).epsilon(1e-6));
  // A new step starts from nothing again.
  layer.moe.step_state().reset();
  CHECK(layer.moe.forward(b).aux_loss.item<double>() ==
        Approx(model::load_balancing_loss(probs_of(b), std::get<1>(probs_of(b).topk(2, -1)), kExperts).item<double>()).epsilon(1e-6));
}

TEST_CASE("sigmoid group-limited routing (DeepSeek-V3) picks the best experts of the best groups", "[model][moe]") {
  // 8 experts in 4 groups of 2; each token may use 2 groups; top-2; weights renormalised x 2.5.
  model::RouterOptions options;
  options.top_k = 2;
  options.sigmoid = true;
  options.n_group = 4;
  options.topk_group = 2;
  options.scaling = 2.5;
  const at::Tensor logits = model_test::randn({16, 8}, 61).to(at::kFloat) * 3;
  const at::Tensor bias = model_test::randn({8}, 62).to(at::kFloat) * 0.5;
  for (const bool with_bias : {false, true}) {
    CAPTURE(with_bias);
    const model::Routing r = model::route(logits, options, with_bias ? bias : at::Tensor());
    for (int64_t t = 0; t < 16; ++t) {
      // By hand: sigmoid scores, selection = score + bias, groups ranked by their two experts' sum.
      std::vector<double> score(8), select(8);
      for (int64_t e = 0; e < 8; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-logits[t][e].item<double>()));
        select[e] = score[e] + (with_bias ? bias[e].item<double>() : 0.0);
      }
      std::vector<std::pair<double, int64_t>> groups;
      for (int64_t g = 0; g < 4; ++g) groups.push_back({select[2 * g] + select[2 * g + 1], g});
      std::sort(groups.rbegin(), groups.rend());
      std::vector<std::pair<double, int64_t>> candidates;
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t e : {2 * groups[i].second, 2 * groups[i].second + 1}) candidates.push_back({select[e], e});
      std::sort(candidates.rbegin(), candidates.rend());
      const int64_t a = candidates[0].second, b = candidates[1].second;
      CHECK(r.chosen[t][0].item<int64_t>() == a);
      CHECK(r.chosen[t][1].item<int64_t>() == b);
      // Weights: the scores without bias, renormalised, scaled.
      CHECK(r.weights[t][0].item<double>() == Approx(2.5 * score[a] / (score[a] + score[b])).epsilon(1e-5));
      CHECK(r.weights[t][1].item<double>() == Approx(2.5 * score[b] / (score[a] + score[b])).epsilon(1e-5));
      // The load-balancing probabilities: scores normalised per token.
      double total = 0;
      for (double s : score) total += s;
      CHECK(r.probs[t][a].item<double>() == Approx(score[a] / total).epsilon(1e-5));
    }
  }
}

TEST_CASE("routing biases move by rate * sign(mean load - load) and round-trip through JSON", "[model][moe]") {
  model::RoutingBias bias({1, 3}, 4, c10::Device(c10::DeviceType::CPU));
  const at::Tensor loads = at::tensor({10.0, 20.0, 30.0, 20.0, 5.0, 5.0, 5.0, 5.0}, at::kDouble).view({2, 4});
  bias.update(loads, 0.01);
  // Layer 1: mean 20, so +0.01, 0, -0.01, 0; layer 3 is balanced: unchanged.
  CHECK(bias.row(1)[0].item<float>() == Approx(0.01));
  CHECK(bias.row(1)[1].item<float>() == 0);
  CHECK(bias.row(1)[2].item<float>() == Approx(-0.01));
  CHECK(at::equal(bias.row(3), at::zeros({4})));
  model::RoutingBias copy({1, 3}, 4, c10::Device(c10::DeviceType::CPU));
  copy.load(bias.to_json());
  CHECK(at::equal(copy.table(), bias.table()));
  model::RoutingBias other({1, 3}, 5, c10::Device(c10::DeviceType::CPU));
  CHECK_THROWS_WITH(other.load(bias.to_json()), Catch::Contains("has 4 experts, the model 5"));
  // A Moe layer routes with its row: a large bias forces an expert into every token's top-k.
  MoeLayer layer(1, 0, std::nullopt);
  model::RoutingBias push({0}, kExperts, c10::Device(c10::DeviceType::CPU));
  layer.moe.set_routing_bias(push.row(0));
  push.update(at::tensor({0.0, 1.0, 1.0, 1.0}, at::kDouble).view({1, 4}), 2.0);  // expert 0 +2, others -2
  CHECK(to_vector(layer.moe.forward(routed_tokens()).tokens_per_expert) == std::vector<int64_t>{6, 0, 0, 0});
}
