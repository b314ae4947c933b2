#pragma once
// The update of an optimizer over flat pieces of parameters: how a piece is updated from its
// gradient and what state it keeps (AdamW with fp32 or bf16 moments, 8-bit AdamW, Lion; Muon,
// whose layer matrices are updated from their whole orthogonalised matrix). The
// replicated optimizer (local_optimizer.h) hands a rule whole parameters, the distributed optimizer
// of ZeRO (engine/zero/distributed_optimizer.h) the fragments of its shards; a rule updates every
// element the same way whichever pieces it gets, so the update does not depend on the mesh (8-bit
// blocks are the parameter's own, block_grid.h: a block cut between pieces gets its maximum from
// all of them through block_maxima and the caller's reduction; Muon's matrices are assembled
// whole by the caller, engine/whole_matrices.h).
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optim/block_grid.h"
#include "recipe/recipe.h"

namespace trainer::optim {

// Where a piece lies: elements [offset, offset + length) of the rank's slice of a parameter
// (its tp/ep slice with any padding rows), flattened row-major.
struct PieceGeometry {
  std::string parameter;       // global name, for messages and checkpoint names
  int64_t offset = 0, length = 0;
  int64_t row_length = 1;      // the slice's last dimension (1-D: its length)
  int64_t dims = 1;            // dimensions of the parameter
  int64_t global_numel = 0;    // elements of the whole parameter (all ranks' slices)
  bool decay = true;           // takes weight decay
  // A layer's weight matrix (model::Parameter::layer_matrix) of `rows` x `cols` in all (global).
  bool matrix = false;
  int64_t rows = 0, cols = 0;
  BlockGrid grid() const { return BlockGrid::of_row_length(row_length); }
};

// One state tensor of a piece: one value per element of the piece (in `dtype`), or one fp32 value
// per quantisation block the piece touches (per_block).
struct StateSpec {
  std::string name;  // checkpoint name: "optimizer.<name>.<parameter>"
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool per_block = false;
};

struct Piece {
  at::Tensor weight;               // fp32, 1-D [length]: the master weights, updated in place
  at::Tensor grad;                 // 1-D [length]: the reduced, clipped gradient, any float dtype
  at::Tensor step;                 // fp32 scalar beside the state: this piece's step count
  std::vector<at::Tensor>* state;  // as make_state made them
  const PieceGeometry* geometry;
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // The state a piece keeps (what make_state allocates), in order.
  virtual std::vector<StateSpec> state_specs(const PieceGeometry& piece) const = 0;
  // Zeros of the specs' sizes and dtypes on the device of `like`.
  std::vector<at::Tensor> make_state(const PieceGeometry& piece, const at::TensorOptions& like) const;

  // Block-wise quantised state (8-bit AdamW): for each piece, the absolute maxima of its new
  // moments over the blocks it touches ([2, blocks] fp32; undefined for a piece without blocks),
  // computed from the gradients now in the pieces without changing anything. The caller takes the
  // maximum over every rank holding part of a block, then passes them to update().
  virtual bool blockwise() const { return false; }
  virtual std::vector<at::Tensor> block_maxima(const std::vector<Piece>& /*pieces*/) const { return {}; }

  // Whole-matrix rules (Muon): pieces of layer matrices (PieceGeometry::matrix) are updated from
  // a function of their whole matrix. matrix_inputs() advances their momentum and returns, per
  // piece, the fp32 values [length] to orthogonalise (undefined for pieces updated element-wise);
  // the caller assembles each matrix from its pieces on every rank (rows x cols, row-major), calls
  // orthogonalize() on it once, and passes each piece its part of the result to update().
  virtual bool whole_matrices() const { return false; }
  virtual std::vector<at::Tensor> matrix_inputs(const std::vector<Piece>& /*pieces*/) { return {}; }
  virtual at::Tensor orthogonalize(const at::Tensor& matrix) const { return matrix; }

  // One update of every piece at learning rate lr, `step` being the step count after it (1 on the
  // first); the pieces' step tensors advance by one. weight_decay applies to pieces whose geometry
  // says so. combined, one per piece: block_maxima's, reduced (blockwise rules), or each piece's
  // part of its orthogonalised matrix (whole-matrix rules); empty for other rules.
  virtual void update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                      const std::vector<at::Tensor>& combined) = 0;

  // Bytes per element of fp32 copies of state that update() keeps for a whole slice of pieces at
  // once (run_update counts them against its copy budget beside the widened gradients).
  virtual int64_t widened_state_bytes(const PieceGeometry& /*piece*/) const { return 0; }

  // What the run's opening line calls it ("AdamW", "AdamW (bf16 moments)", ...).
  virtual std::string describe() const = 0;
};

// The rule of optimizer.name, with its settings.
std::unique_ptr<UpdateRule> make_update_rule(const recipe::OptimizerConfig& config);

// What the caller does across pieces and ranks between a rule's passes.
struct CrossPiece {
  // Blockwise rules: the maximum of each block over every rank holding part of it (null when no
  // block is shared).
  std::function<void(std::vector<at::Tensor>& maxima)> reduce_maxima;
  // Whole-matrix rules: replaces each piece's matrix input by its part of the rule's
  // orthogonalize() of the whole matrix (null: every matrix is whole in one piece here), calling
  // `meanwhile` once while the matrices travel between ranks (or before, when none do).
  std::function<void(std::vector<at::Tensor>& inputs, const std::function<void()>& meanwhile)> orthogonalize;
};

// Runs a rule over pieces in slices whose fp32 gradient copies stay near `copy_budget_bytes`
// (gradients that are not fp32 are widened a slice at a time; results do not depend on the budget).
// Blockwise rules take two passes: maxima over all slices, cross.reduce_maxima, then the updates;
// whole-matrix rules: the matrix inputs of every piece at once, cross.orthogonalize, with the
// element-wise pieces (Muon's AdamW part) updated while the matrices travel, then the matrices'
// updates.
void run_update(UpdateRule& rule, const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                int64_t copy_budget_bytes, const CrossPiece& cross);

}  // namespace trainer::optim
