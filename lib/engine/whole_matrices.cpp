#include "engine/whole_matrices.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace trainer::engine {

namespace {

// One all-to-all of flat fp32 values: what each rank sends and receives, in rank order. Tensors
// are let go as soon as they are copied, so that about two copies of the matrices' pieces exist
// at a time (the estimator's figure): pack() concatenates what is sent (the caller then lets go of
// the originals), launch() allocates the receive buffer and starts, finish() lets go of the send
// buffer.
struct Exchange {
  comm::Communicator* group = nullptr;
  std::vector<std::vector<at::Tensor>> to;   // per destination rank, in order
  std::vector<int64_t> out_splits;
  at::Tensor out;
  std::unique_ptr<comm::Work> work;

  explicit Exchange(comm::Communicator* g) : group(g), to(size_t(g->size())), out_splits(size_t(g->size()), 0) {}
  std::vector<int64_t> in_splits;
  at::Tensor in;

  void pack(const at::TensorOptions& options) {
    int64_t total = 0;
    for (const auto& parts : to) {
      int64_t n = 0;
      for (const at::Tensor& t : parts) n += t.numel();
      in_splits.push_back(n);
      total += n;
    }
    // Copied straight into the send buffer: a part that is not contiguous (a column block of a
    // matrix) needs no copy of its own.
    in = at::empty({total}, options);
    int64_t at = 0;
    for (const auto& parts : to)
      for (const at::Tensor& t : parts) {
        in.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
        at += t.numel();
      }
    to.clear();
  }
  void launch(const at::TensorOptions& options) {
    out = at::empty({std::accumulate(out_splits.begin(), out_splits.end(), int64_t(0))}, options);
    work = group->all_to_all(out, in, out_splits, in_splits);
  }
  void finish() {
    if (!work) return;
    work->wait();
    work.reset();
    in = at::Tensor();  // kept until the exchange is done (a GPU may still read it before)
  }
};

}  // namespace

std::pair<int64_t, int64_t> WholeMatrices::Matrix::range(int64_t s) const {
  if (!held.shard_group) return {0, slice_numel};
  const int64_t lo = std::max(held.bucket_offset, s * held.shard_numel) - held.bucket_offset;
  const int64_t hi = std::min(held.bucket_offset + slice_numel, (s + 1) * held.shard_numel) - held.bucket_offset;
  return hi > lo ? std::pair{lo, hi} : std::pair{int64_t(0), int64_t(0)};
}

WholeMatrices::WholeMatrices(const mesh::ProcessGroups& groups, const std::deque<model::Parameter>& params,
                             std::vector<Held> held, at::Device device)
    : device_(device) {
  for (const Held& h : held) {
    const model::Parameter& p = params.at(h.param);
    if (p.global_shape.size() != 2 || p.shards.size() > 1)
      throw std::logic_error("WholeMatrices: " + p.name + " is not a matrix split along at most one dimension");
    Matrix m;
    m.held = h;
    if (m.held.shard_group && m.held.shard_group->size() == 1) m.held.shard_group = nullptr;
    m.rows = p.global_shape[0];
    m.cols = p.global_shape[1];
    m.slice_shape = p.tensor.sizes().vec();
    m.slice_numel = p.tensor.numel();
    if (!m.held.shard_group && m.held.piece < 0)
      throw std::logic_error("WholeMatrices: no piece of " + p.name + " here and no group to fetch it from");
    if (p.shards.size() == 1) {
      const model::ShardSpec& spec = p.shards.front();
      comm::Communicator& group = groups.get(spec.group);
      if (spec.padding != 0 || spec.length * group.size() != p.global_shape[size_t(spec.dim)] ||
          spec.offset != group.rank() * spec.length)
        throw std::logic_error(fmt::format("WholeMatrices: {} is not split evenly in rank order over {}", p.name,
                                           group.name()));
      if (group.size() > 1) {
        m.split_group = &group;
        m.split_dim = spec.dim;
      }
    }
    matrices_.push_back(std::move(m));
  }
  // Owners, per family of matrices held by the same groups (the same list on every rank of them):
  // largest first, each to the least loaded of the family's shard x split positions.
  std::map<std::pair<comm::Communicator*, comm::Communicator*>, std::vector<size_t>> families;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const Matrix& m = matrices_[i];
    families[{m.held.shard_group, m.split_group}].push_back(i);
    if (m.held.shard_group && std::find(shard_groups_.begin(), shard_groups_.end(), m.held.shard_group) == shard_groups_.end())
      shard_groups_.push_back(m.held.shard_group);
    if (m.split_group && std::find(split_groups_.begin(), split_groups_.end(), m.split_group) == split_groups_.end())
      split_groups_.push_back(m.split_group);
  }
  const auto cost = [&](size_t i) {
    const double a = double(std::min(matrices_[i].rows, matrices_[i].cols));
    return a * a * double(std::max(matrices_[i].rows, matrices_[i].cols));
  };
  for (auto& [key, members] : families) {
    const int64_t split = key.second ? key.second->size() : 1;
    const int64_t positions = (key.first ? key.first->size() : 1) * split;
    std::stable_sort(members.begin(), members.end(), [&](size_t a, size_t b) { return cost(a) > cost(b); });
    std::vector<double> load(size_t(positions), 0.0);
    for (size_t i : members) {
      const auto least = size_t(std::min_element(load.begin(), load.end()) - load.begin());
      load[least] += cost(i);
      matrices_[i].shard_owner = int64_t(least) / split;
      matrices_[i].split_owner = int64_t(least) % split;
    }
  }
}

int64_t WholeMatrices::owned() const {
  return std::count_if(matrices_.begin(), matrices_.end(), [&](const Matrix& m) { return owns(m); });
}

void WholeMatrices::orthogonalize(std::vector<at::Tensor>& inputs,
                                  const std::function<at::Tensor(const at::Tensor&)>& f,
                                  const std::function<void()>& meanwhile) const {
  at::NoGradGuard no_grad;
  bool ran = false;
  const auto run_meanwhile = [&] {
    if (!ran && meanwhile) meanwhile();
    ran = true;
  };
  if (matrices_.empty()) return run_meanwhile();
  const at::TensorOptions options = at::TensorOptions().dtype(at::kFloat).device(device_);
  const auto piece_of = [&](const Matrix& m) -> const at::Tensor& {
    const at::Tensor& t = inputs.at(size_t(m.held.piece));
    const auto [lo, hi] = m.range(shard_rank(m));
    if (!t.defined() || t.numel() != hi - lo)
      throw std::logic_error(fmt::format("WholeMatrices: a piece of {} elements where {} are held", t.defined() ? t.numel() : 0,
                                         hi - lo));
    return t;
  };
  const size_t n = matrices_.size();
  std::vector<at::Tensor> slices(n);  // the assembled local slices, flat (on the rank assembling each)

  // 1. Each slice from the shards of its bucket's group onto its shard owner.
  std::vector<Exchange> exchanges;
  for (comm::Communicator* group : shard_groups_) {
    Exchange& x = exchanges.emplace_back(group);
    for (const Matrix& m : matrices_) {
      if (m.held.shard_group != group) continue;
      const auto [lo, hi] = m.range(group->rank());
      if (hi > lo) x.to[size_t(m.shard_owner)].push_back(piece_of(m));
      if (assembles_slice(m))
        for (int64_t s = 0; s < group->size(); ++s) x.out_splits[size_t(s)] += m.range(s).second - m.range(s).first;
    }
    x.pack(options);
  }
  for (size_t i = 0; i < n; ++i)
    if (!matrices_[i].held.shard_group) slices[i] = piece_of(matrices_[i]);
  for (const Matrix& m : matrices_)
    if (m.held.piece >= 0) inputs[size_t(m.held.piece)] = at::Tensor();  // packed (or in slices)
  for (Exchange& x : exchanges) x.launch(options);
  if (!exchanges.empty()) run_meanwhile();
  for (Exchange& x : exchanges) {
    x.finish();
    std::vector<std::vector<at::Tensor>> parts(n);
    int64_t at = 0;
    for (int64_t s = 0; s < x.group->size(); ++s)
      for (size_t i = 0; i < n; ++i) {
        const Matrix& m = matrices_[i];
        if (m.held.shard_group != x.group || !assembles_slice(m)) continue;
        const auto [lo, hi] = m.range(s);
        parts[i].push_back(x.out.narrow(0, at, hi - lo));
        at += hi - lo;
      }
    for (size_t i = 0; i < n; ++i)
      if (!parts[i].empty()) slices[i] = at::cat(parts[i]);
    x.out = at::Tensor();
  }

  // 2. Each matrix from its tp slices onto its owner, among the ranks that assembled the slices.
  std::vector<at::Tensor> whole(n);
  exchanges.clear();
  for (comm::Communicator* group : split_groups_) {
    Exchange& x = exchanges.emplace_back(group);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const Matrix& m = matrices_[i];
      if (m.split_group != group || !assembles_slice(m)) continue;
      any = true;
      x.to[size_t(m.split_owner)].push_back(slices[i]);
      if (owns(m))
        for (int64_t t = 0; t < group->size(); ++t) x.out_splits[size_t(t)] += m.slice_numel;
    }
    // The same on every rank of the group: its ranks share their shard positions.
    if (any) x.pack(options);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!matrices_[i].split_group && owns(matrices_[i])) whole[i] = slices[i].view({matrices_[i].rows, matrices_[i].cols});
    slices[i] = at::Tensor();
  }
  bool launched = false;
  for (Exchange& x : exchanges)
    if (x.in.defined()) {
      x.launch(options);
      launched = true;
    }
  if (launched) run_meanwhile();
  for (Exchange& x : exchanges) {
    if (!x.work) continue;
    x.finish();
    std::vector<std::vector<at::Tensor>> parts(n);
    int64_t at = 0;
    for (int64_t t = 0; t < x.group->size(); ++t)
      for (size_t i = 0; i < n; ++i) {
        const Matrix& m = matrices_[i];
        if (m.split_group != x.group || !owns(m)) continue;
        parts[i].push_back(x.out.narrow(0, at, m.slice_numel).view(m.slice_shape));
        at += m.slice_numel;
      }
    for (size_t i = 0; i < n; ++i)
      if (!parts[i].empty()) whole[i] = at::cat(parts[i], matrices_[i].split_dim);
    x.out = at::Tensor();
  }

  // 3. The owners' work.
  run_meanwhile();
  std::vector<at::Tensor> results(n);
  for (size_t i = 0; i < n; ++i)
    if (owns(matrices_[i])) {
      results[i] = f(whole[i]);
      whole[i] = at::Tensor();
    }

  // 4. Back to the slices' assemblers...
  exchanges.clear();
  for (comm::Communicator* group : split_groups_) {
    Exchange& x = exchanges.emplace_back(group);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const Matrix& m = matrices_[i];
      if (m.split_group != group || !assembles_slice(m)) continue;
      any = true;
      if (owns(m)) {
        const int64_t width = m.slice_shape[size_t(m.split_dim)];
        for (int64_t t = 0; t < group->size(); ++t)
          x.to[size_t(t)].push_back(results[i].narrow(m.split_dim, t * width, width));
      }
      x.out_splits[size_t(m.split_owner)] += m.slice_numel;
    }
    if (any) x.pack(options);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!matrices_[i].split_group && owns(matrices_[i])) slices[i] = results[i].reshape({-1});
    results[i] = at::Tensor();
  }
  for (Exchange& x : exchanges)
    if (x.in.defined()) x.launch(options);
  for (Exchange& x : exchanges) {
    if (!x.work) continue;
    x.finish();
    int64_t at = 0;
    for (int64_t t = 0; t < x.group->size(); ++t)
      for (size_t i = 0; i < n; ++i) {
        const Matrix& m = matrices_[i];
        if (m.split_group != x.group || !assembles_slice(m) || m.split_owner != t) continue;
        slices[i] = x.out.narrow(0, at, m.slice_numel);
        at += m.slice_numel;
      }
    x.out = at::Tensor();  // the slices keep what they view
  }

  // 5. ... and back to the shards.
  exchanges.clear();
  for (comm::Communicator* group : shard_groups_) {
    Exchange& x = exchanges.emplace_back(group);
    for (const Matrix& m : matrices_) {
      if (m.held.shard_group != group) continue;
      const size_t i = size_t(&m - matrices_.data());
      if (assembles_slice(m))
        for (int64_t s = 0; s < group->size(); ++s) {
          const auto [lo, hi] = m.range(s);
          if (hi > lo) x.to[size_t(s)].push_back(slices[i].narrow(0, lo, hi - lo));
        }
      const auto [lo, hi] = m.range(group->rank());
      x.out_splits[size_t(m.shard_owner)] += hi - lo;
    }
    x.pack(options);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!matrices_[i].held.shard_group) inputs[size_t(matrices_[i].held.piece)] = slices[i];
    slices[i] = at::Tensor();
  }
  for (Exchange& x : exchanges) x.launch(options);
  for (Exchange& x : exchanges) {
    x.finish();
    int64_t at = 0;
    for (int64_t s = 0; s < x.group->size(); ++s)
      for (const Matrix& m : matrices_) {
        if (m.held.shard_group != x.group || m.shard_owner != s) continue;
        const auto [lo, hi] = m.range(x.group->rank());
        if (hi == lo) continue;
        inputs[size_t(m.held.piece)] = x.out.narrow(0, at, hi - lo);
        at += hi - lo;
      }
  }
}

}  // namespace trainer::engine
