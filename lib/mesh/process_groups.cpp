#include "mesh/process_groups.h"

#include <fmt/format.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/gloo_communicator.h"
#include "comm/host_staging_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/recording_communicator.h"

namespace trainer::mesh {

namespace {

std::unique_ptr<comm::Communicator> make_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                                               const std::vector<int64_t>& ranks, int64_t global_rank,
                                               const std::shared_ptr<comm::CommContext>& context,
                                               const Backend& backend,
                                               const std::shared_ptr<comm::FlightRecorder>& recorder) {
  if (ranks.size() == 1 || !store) return comm::make_self_communicator(name, global_rank);
  const std::string prefix = fmt::format("pg/{}/{}", name, ranks.front());
  if (backend.kind == Backend::Kind::Nccl)
    return comm::record_collectives(
        comm::make_nccl_communicator(store, prefix, name, ranks, global_rank, context, backend.device_index), recorder);
  auto gloo = comm::make_gloo_communicator(store, prefix, name, ranks, global_rank, context, backend.interface_address);
  if (backend.stage_cuda_tensors) gloo = comm::stage_through_host(std::move(gloo));
  return comm::record_collectives(std::move(gloo), recorder);
}

// The recorder's own store client, with a short timeout: a frozen store host cannot hang a report.
std::shared_ptr<comm::FlightRecorder> make_recorder(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const comm::CommContext& context) {
  const auto exchange = std::min(std::chrono::milliseconds(5000), context.timeout / 2);
  c10::intrusive_ptr<c10d::Store> client;
  if (store) {
    client = store->clone();
    client->setTimeout(exchange);
  }
  return std::make_shared<comm::FlightRecorder>(context, client, exchange);
}

}  // namespace

ProcessGroups::ProcessGroups(RankLayout layout, int64_t global_rank, const c10::intrusive_ptr<c10d::Store>& store,
                             std::shared_ptr<comm::CommContext> context, const Backend& backend)
    : layout_(std::move(layout)),
      global_rank_(global_rank),
      coordinates_(layout_.coordinates(global_rank)),
      context_(std::move(context)),
      store_(store),
      recorder_(make_recorder(store, *context_)) {
  std::vector<int64_t> everyone;
  for (int64_t r = 0; r < layout_.world_size(); ++r) everyone.push_back(r);
  // One communicator per distinct rank set (one set of connections and, with NCCL, one
  // communicator and watchdog thread), named after every kind that uses it. Groups partition the
  // ranks, so every member of a set sees the same kinds map onto it and creates it at the same
  // point of this fixed order: creation (a rendezvous among the members) cannot deadlock.
  //
  // The expert groups (ep, etp) get communicators of their own: their collectives run inside
  // forward and backward at points that depend on the routing (experts without tokens change the
  // backward graph), so sharing a communicator with the gradient buckets' asynchronous reductions
  // could issue the two in different orders on different ranks. For the same reason the expert
  // gradients' group (edp) has its own: an expert without tokens on one rank gets its gradient at
  // another point of backward there, so its bucket launches at another point than on the other
  // ranks, which must not be between two tensor-parallel collectives sharing its communicator.
  const auto lane = [](GroupKind kind) {
    return kind == GroupKind::Ep || kind == GroupKind::Etp ? 1 : kind == GroupKind::Edp ? 2 : 0;
  };
  using Key = std::pair<int, std::vector<int64_t>>;
  std::vector<std::pair<std::string, Key>> wanted = {{"world", {0, everyone}}};
  for (GroupKind kind : all_group_kinds())
    wanted.emplace_back(group_kind_name(kind), Key{lane(kind), layout_.group(kind, global_rank)});
  std::map<Key, std::string> names;
  for (const auto& [name, key] : wanted) names[key] += (names[key].empty() ? "" : "/") + name;
  std::map<Key, std::shared_ptr<comm::Communicator>> made;
  for (const auto& [name, key] : wanted)
    if (!made.count(key))
      made[key] = make_group(store, names.at(key), key.second, global_rank, context_, backend, recorder_);
  world_ = made.at(Key{0, everyone});
  for (GroupKind kind : all_group_kinds()) groups_[kind] = made.at(Key{lane(kind), layout_.group(kind, global_rank)});
}

ProcessGroups::~ProcessGroups() = default;

std::unique_ptr<ProcessGroups> single_process_groups() {
  recipe::MeshShape shape;  // all ones
  return std::make_unique<ProcessGroups>(RankLayout(shape), 0, c10::intrusive_ptr<c10d::Store>(),
                                         std::make_shared<comm::CommContext>(), Backend{});
}

}  // namespace trainer::mesh
