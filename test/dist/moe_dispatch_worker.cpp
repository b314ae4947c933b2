// One rank of the expert-parallel dispatch test: `moe_dispatch_worker EXPERTS TOP_K [ETP]` with
// RANK, WORLD_SIZE (ep x etp), MASTER_ADDR and MASTER_PORT in the environment. Every rank builds
// the expert-parallel MoE layer (its E / ep experts, each split etp ways) and the whole
// single-rank layer (initialisation is global), in fp64, routes its own tokens (a different number on each rank, so the splits are
// uneven) through both, and checks the output, the input gradient and the router gradient against
// the whole layer on the same tokens, and each local expert's weight gradients against the whole
// layers' gradients summed over the ranks (an expert sees every rank's tokens routed to it), its
// etp slice of them. The
// router never picks the last expert, so one rank's expert receives no tokens at all. Exit 0 and
// "dispatch matches" when everything matches.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "model/moe.h"
#include "expect_close.h"
#include "worker_groups.h"

using namespace trainer;

namespace {

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  test::expect_close(actual, expected, what, 1e-10, 1e-12);
}

at::Tensor grad_of(const model::ParameterSet& params, const std::string& name) {
  const model::Parameter* p = params.find(name);
  if (!p || !p->tensor.grad().defined()) return at::Tensor();
  return p->tensor.grad();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 3 && argc != 4) throw std::runtime_error("usage: moe_dispatch_worker EXPERTS TOP_K [ETP]");
    const int64_t experts = std::atoll(argv[1]), top_k = std::atoll(argv[2]), etp_size = argc == 4 ? std::atoll(argv[3]) : 1;
    const auto env = runtime::detect_launch_environment();
    recipe::MeshShape s;
    s.world_size = s.dp = env.world_size;
    s.etp = etp_size;
    s.ep = env.world_size / etp_size;
    s.edp = 1;
    const auto owned = test::worker_groups(s);
    mesh::ProcessGroups& groups = *owned;
    comm::Communicator& ep = groups.get(mesh::GroupKind::Ep);
    comm::Communicator& etp = groups.get(mesh::GroupKind::Etp);
    const int64_t rank = groups.global_rank(), size = ep.size();

    recipe::ModelConfig config;
    config.hidden_size = 10;  // odd sizes on purpose (the expert width splits 2 ways)
    recipe::MoeConfig moe;
    moe.num_local_experts = experts;
    moe.num_experts_per_tok = top_k;
    moe.moe_intermediate_size = etp_size == 1 ? 7 : 6;
    config.moe = moe;
    const model::ParameterOptions options{5, 0.3, at::kDouble};
    const std::string prefix = "model.layers.0.block_sparse_moe.";
    model::ParameterSet whole_params(options), ep_params(options);
    const model::Moe whole(whole_params, prefix, config, {});
    const model::Moe spread(ep_params, prefix, config, {}, model::ExpertParallel{ep.rank(), size, &ep, nullptr, nullptr, {etp.rank(), etp.size(), &etp}});
    // The last expert is never chosen: every token's first feature is 1, and the router weighs it
    // -100 for that expert.
    for (auto* params : {&whole_params, &ep_params}) {
      at::NoGradGuard no_grad;
      params->find(prefix + "gate.weight")->tensor[experts - 1][0].fill_(-100.0);
    }

    // Rank r routes 5 + 3 r tokens of its own.
    const int64_t tokens = 5 + 3 * rank;
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    at::manual_seed(100 + uint64_t(rank));
    at::Tensor x = at::randn({tokens, 10}, f64);
    x.select(1, 0).fill_(1.0);
    const at::Tensor g = at::randn({tokens, 10}, f64);
    const at::Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
    const model::MoeOutput a = whole.forward(xa), b = spread.forward(xb);
    expect_close(b.output, a.output, "output");
    expect_close(b.tokens_per_expert, a.tokens_per_expert, "tokens per expert");
    (a.output * g).sum().backward();
    (b.output * g).sum().backward();
    expect_close(xb.grad(), xa.grad(), "input gradient");
    expect_close(grad_of(ep_params, prefix + "gate.weight"), grad_of(whole_params, prefix + "gate.weight"),
                 "router gradient");

    // Every expert's weight gradients of the whole layer, summed over the ranks' tokens.
    int64_t received_nothing = 0;
    for (int64_t e = 0; e < experts; ++e)
      for (const char* w : {"w1", "w2", "w3"}) {
        const std::string name = fmt::format("{}experts.{}.{}.weight", prefix, e, w);
        const model::Parameter* p = whole_params.find(name);
        at::Tensor sum = p->tensor.grad().defined() ? p->tensor.grad().clone() : at::zeros_like(p->tensor);
        groups.world().all_reduce(sum, comm::ReduceOp::Sum)->wait();
        const model::Parameter* mine = ep_params.find(name);
        if (!mine) continue;  // held by another rank
        for (const auto& shard : mine->shards) sum = sum.narrow(shard.dim, shard.offset, shard.length);
        const at::Tensor got = mine->tensor.grad().defined() ? mine->tensor.grad() : at::zeros_like(mine->tensor);
        expect_close(got, sum, name + " gradient");
        if (e == experts - 1 && std::string(w) == "w1") received_nothing += got.abs().sum().item<double>() == 0;
      }
    const int64_t held_last = ep.rank() == size - 1;
    if (received_nothing != held_last) throw std::runtime_error("the unused expert received tokens");
    std::printf("rank %lld: %lld tokens, dispatch matches (output, input, router and expert gradients)\n",
                (long long)rank, (long long)tokens);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_dispatch_worker: %s\n", e.what());
    return 1;
  }
}
