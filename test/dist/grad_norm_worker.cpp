// One rank of the gradient-norm test: `grad_norm_worker SHARDED` with RANK, WORLD_SIZE=4,
// MASTER_ADDR and MASTER_PORT in the environment. Four ranks as tp = 2 x dp = 2 for dense
// parameters and ep = 2 x edp = 2 for an expert parameter, with hand-built parameters of odd
// sizes: column and row slices of uneven width over tp, a norm weight replicated on every rank, an
// expert weight split over ep and reduced over edp. Each rank contributes a share of a known global
// gradient; after the buckets' reductions (all-reduce, or ZeRO-1 reduce-scatter when SHARDED is 1)
// the gradient norm, the clipped gradients and the checkpoint writers must be those of the single
// process holding the global tensors. Prints "WRITE name offsets" for each parameter slice it
// would write to a checkpoint; exit 0 when everything matches.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "checkpoint/shard_assignment.h"
#include "mesh/process_groups.h"
#include "engine/grad_buckets.h"
#include "engine/replicas.h"
#include "worker_groups.h"

using namespace trainer;

namespace {

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t dim;                  // split dimension, -1: whole
  std::vector<int64_t> cuts;    // offsets of piece 0 and 1 along dim, then the end
  mesh::GroupKind split_group;  // tp or ep
  mesh::GroupKind grad_group;   // dp_cp or edp
};

const std::vector<Spec> kSpecs = {
    {"col.weight", {5, 3}, 0, {0, 3, 5}, mesh::GroupKind::Tp, mesh::GroupKind::DpCp},
    {"row.weight", {4, 7}, 1, {0, 4, 7}, mesh::GroupKind::Tp, mesh::GroupKind::DpCp},
    {"norm.weight", {6}, -1, {}, mesh::GroupKind::Tp, mesh::GroupKind::DpCp},
    {"expert.weight", {3, 5}, 0, {0, 2, 3}, mesh::GroupKind::Ep, mesh::GroupKind::Edp},
};

at::Tensor global_gradient(size_t index, const Spec& s) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + index);
  return at::randn(s.shape, generator, at::TensorOptions().dtype(at::kFloat));
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 2) throw std::runtime_error("usage: grad_norm_worker SHARDED");
    const bool sharded = std::atoi(argv[1]) != 0;
    recipe::MeshShape s;
    s.world_size = 4, s.tp = 2, s.dp = 2, s.ep = 2, s.edp = 2;
    const auto owned = test::worker_groups(s);
    mesh::ProcessGroups& groups = *owned;
    const mesh::RankLayout& layout = groups.layout();
    const int64_t rank = groups.global_rank();

    model::ParameterSet params(model::ParameterOptions{1, 0.02, at::kFloat});
    std::vector<at::Tensor> slices;  // this rank's slice of each global gradient
    double expected_sq = 0;
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      const Spec& spec = kSpecs[i];
      const at::Tensor global = global_gradient(i, spec);
      expected_sq += global.to(at::kDouble).pow(2).sum().item<double>();
      std::vector<model::ShardSpec> shards;
      at::Tensor slice = global;
      if (spec.dim >= 0) {
        const int64_t piece = layout.index_in(spec.split_group, rank);
        const int64_t offset = spec.cuts[size_t(piece)], length = spec.cuts[size_t(piece) + 1] - offset;
        shards.push_back({spec.dim, offset, length, spec.split_group});
        slice = global.narrow(spec.dim, offset, length).contiguous();
      }
      params.create(spec.name, spec.shape, model::InitKind::Zeros, shards).grad_group = spec.grad_group;
      slices.push_back(slice);
    }
    engine::BucketOptions options;
    options.bucket_bytes = 40;  // several buckets
    options.sharded = sharded;
    engine::GradBuckets buckets(params.all(), groups, options);

    // Each rank of a parameter's reduction group adds a different share; the shares sum to one.
    buckets.begin_step();
    buckets.begin_backward(0, true);
    for (size_t i = 0; i < kSpecs.size(); ++i) {
      comm::Communicator& g = groups.get(kSpecs[i].grad_group);
      const double n = double(g.size()), share = double(g.rank() + 1) / (n * (n + 1) / 2);
      model::accumulate_gradient(params.all()[i], slices[i] * share);
    }
    buckets.end_backward(0);
    buckets.finish();

    const double expected = std::sqrt(expected_sq);
    const double norm = buckets.grad_norm().item<double>();
    std::printf("rank %lld: norm %.9g expected %.9g\n", (long long)rank, norm, expected);
    expect(std::fabs(norm - expected) <= 1e-6 * expected, fmt::format("gradient norm {} but expected {}", norm, expected));

    // Clip to half the norm: every reduced element is scaled by the same coefficient.
    const double coefficient = expected / 2 / (norm + 1e-6);
    buckets.scale(at::full({}, coefficient, at::kDouble));
    const double clipped = buckets.grad_norm().item<double>();
    expect(std::fabs(clipped - expected / 2) <= 1e-6 * expected, fmt::format("clipped norm {}", clipped));
    for (const auto& b : buckets.buckets()) {
      const int64_t lo = sharded ? engine::GradBuckets::shard_begin(b) : 0;
      const int64_t hi = sharded ? lo + engine::GradBuckets::shard_numel(b) : b.numel;
      for (size_t j = 0; j < b.params.size(); ++j) {
        const at::Tensor want = slices[b.params[j]].reshape({-1}) * coefficient;
        const int64_t begin = b.offsets[j], end = begin + want.numel();
        const int64_t a = std::max(begin, lo), z = std::min(end, hi);
        if (a >= z) continue;
        expect(at::allclose(b.grads.narrow(0, a, z - a), want.narrow(0, a - begin, z - a), 1e-5, 1e-6),
               fmt::format("reduced gradient of {} differs", params.all()[b.params[j]].name));
      }
    }

    // Checkpoint writers: each unique slice once over all ranks.
    std::vector<checkpoint::TensorRecord> records;
    for (const auto& p : params.all()) {
      auto record = checkpoint::TensorRecord::slice(p.name, p.tensor.detach(), p.global_shape, p.offsets());
      const auto holders = engine::parameter_replicas(layout, rank, p);
      if (holders.ranks.size() > 1) record.replicated = engine::as_replication(holders);
      records.push_back(std::move(record));
    }
    for (const auto& r : checkpoint::records_to_write(records))
      std::printf("WRITE %s %s\n", r.name.c_str(), fmt::format("{}", fmt::join(r.offsets, ",")).c_str());
    groups.world().barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grad_norm_worker: %s\n", e.what());
    return 1;
  }
}
