#pragma once
// The communicators of one rank, one per group kind of its RankLayout, created in a deterministic
// order (all_group_kinds()) under unique store prefixes; groups of one rank cost nothing.
#include <c10/util/intrusive_ptr.h>

#include <map>
#include <memory>

#include "comm/communicator.h"
#include "comm/flight_recorder.h"
#include "mesh/rank_layout.h"

namespace c10d {
class Store;
}

namespace trainer::mesh {

// Which library carries the collectives: Gloo on the CPU (or, staging CUDA tensors through host
// memory, for ranks sharing GPUs), NCCL on a GPU per rank.
struct Backend {
  enum class Kind { Gloo, Nccl } kind = Kind::Gloo;
  std::string interface_address;  // Gloo: "127.0.0.1" on one node, "" for the host's default interface
  int device_index = 0;           // NCCL: this rank's GPU
  bool stage_cuda_tensors = false;  // Gloo with CUDA tensors: copied through pinned host buffers
};

class ProcessGroups {
 public:
  ProcessGroups(RankLayout layout, int64_t global_rank, const c10::intrusive_ptr<c10d::Store>& store,
                std::shared_ptr<comm::CommContext> context, const Backend& backend);
  ~ProcessGroups();  // out of line: c10d::Store is incomplete here

  const RankLayout& layout() const { return layout_; }
  int64_t global_rank() const { return global_rank_; }
  const Coordinates& coordinates() const { return coordinates_; }
  comm::Communicator& get(GroupKind kind) const { return *groups_.at(kind); }
  comm::Communicator& world() const { return *world_; }
  comm::CommContext& context() const { return *context_; }
  // The job's rendezvous store (null for a single process without one); checkpoints commit through it.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

 private:
  RankLayout layout_;
  int64_t global_rank_;
  Coordinates coordinates_;
  std::shared_ptr<comm::CommContext> context_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<comm::FlightRecorder> recorder_;  // sees every collective of these groups
  // Kinds with the same ranks (dp and dp_cp when cp = 1, the world and dp in pure data parallelism)
  // share one communicator, named after all of them ("dp/dp_cp/edp").
  std::shared_ptr<comm::Communicator> world_;
  std::map<GroupKind, std::shared_ptr<comm::Communicator>> groups_;
};

// A rank's view when there is a single process: every group is the rank itself.
std::unique_ptr<ProcessGroups> single_process_groups();

}  // namespace trainer::mesh
