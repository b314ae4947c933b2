#pragma once
// Muon's whole matrices under any mesh (optim/muon_rule.h). A layer matrix (model::Parameter::
// layer_matrix) is held in pieces: its tp (or etp) slices on the ranks of the group that splits it,
// and each slice cut by ZeRO into the shards of its gradient bucket's group. Per step the pieces'
// inputs go to one owner rank per matrix: an all-to-all in the bucket's group assembles each slice
// on one of its ranks, an all-to-all in the tp group (among the ranks that assembled slices) the
// whole matrix on one of them; the owner orthogonalises it and the parts go back the same way.
// Owners are spread over the ranks holding a matrix by the largest-first rule on the Newton-Schulz
// cost (min(rows, cols)^2 x max(rows, cols)), so every rank orthogonalises about as much (as
// Megatron's layer-wise distributed optimizer and torchtitan's DistMuon do). Replicas that hold
// the same pieces (replicated data parallelism, hybrid sharding's replica groups) compute the same
// matrices each. The result does not depend on the mesh: each matrix is orthogonalised whole, in
// one place, from the same values.
#include <ATen/core/Tensor.h>

#include <deque>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "mesh/process_groups.h"
#include "model/parameter.h"

namespace trainer::engine {

class WholeMatrices {
 public:
  // One matrix as this rank's optimizer holds it. Every rank of its groups lists the matrices they
  // share in the same order (bucket by bucket, in bucket order).
  struct Held {
    size_t param = 0;                            // index into the parameters
    comm::Communicator* shard_group = nullptr;   // the ranks sharing its slice (its bucket's group); null: whole here
    int64_t bucket_offset = 0;                   // its slice's first element in the bucket
    int64_t shard_numel = 0;                     // elements of each rank's shard of the bucket
    int64_t piece = -1;                          // this rank's piece: index into the inputs (-1: none)
  };
  // `device`: where the exchange's buffers live (the optimizer's: a rank may hold no piece of any
  // matrix and still assemble or own some).
  WholeMatrices(const mesh::ProcessGroups& groups, const std::deque<model::Parameter>& params, std::vector<Held> held,
                at::Device device);

  // inputs[piece] (fp32, [piece length]) are replaced by their part of f(whole matrix) for every
  // held matrix; f maps a rows x cols fp32 matrix to one of its shape. Collective over the groups.
  // `meanwhile` (may be null) runs once while the first exchange is in flight (or before the
  // owners' work when nothing travels): other work of the step that does not need the matrices.
  void orthogonalize(std::vector<at::Tensor>& inputs, const std::function<at::Tensor(const at::Tensor&)>& f,
                     const std::function<void()>& meanwhile = nullptr) const;

  // Matrices this rank orthogonalises each step.
  int64_t owned() const;

 private:
  struct Matrix {
    Held held;
    int64_t rows = 0, cols = 0;             // global
    std::vector<int64_t> slice_shape;       // the local (tp) slice
    int64_t slice_numel = 0;
    comm::Communicator* split_group = nullptr;  // the tp/etp group splitting it, or null
    int64_t split_dim = 0;
    int64_t shard_owner = 0, split_owner = 0;   // owner: rank shard_owner of shard_group, split_owner of split_group
    // Elements [begin, end) of the slice held by rank s of shard_group.
    std::pair<int64_t, int64_t> range(int64_t s) const;
  };
  int64_t shard_rank(const Matrix& m) const { return m.held.shard_group ? m.held.shard_group->rank() : 0; }
  int64_t split_rank(const Matrix& m) const { return m.split_group ? m.split_group->rank() : 0; }
  bool assembles_slice(const Matrix& m) const { return shard_rank(m) == m.shard_owner; }
  bool owns(const Matrix& m) const { return assembles_slice(m) && split_rank(m) == m.split_owner; }

  std::vector<Matrix> matrices_;
  at::Device device_;
  // The groups in the order every rank runs their exchanges.
  std::vector<comm::Communicator*> shard_groups_, split_groups_;
};

}  // namespace trainer::engine
