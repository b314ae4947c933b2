#pragma once
// The element-wise part of an optimizer: how a flat piece of a parameter is updated from its
// gradient and what state it keeps (AdamW with fp32 or bf16 moments, 8-bit AdamW, Lion). The
// replicated optimizer (local_optimizer.h) hands a rule whole parameters, the distributed optimizer
// of ZeRO (engine/zero/distributed_optimizer.h) the fragments of its shards; a rule updates every
// element the same way whichever pieces it gets, so the update does not depend on the mesh (8-bit
// blocks are the parameter's own, block_grid.h: a block cut between pieces gets its maximum from
// all of them through block_maxima and the caller's reduction).
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

  // One update of every piece at learning rate lr, `step` being the step count after it (1 on the
  // first); the pieces' step tensors advance by one. weight_decay applies to pieces whose geometry
  // says so. maxima: block_maxima's, reduced (blockwise rules only).
  virtual void update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                      const std::vector<at::Tensor>& maxima) = 0;

  // Bytes per element of fp32 copies of state that update() keeps for a whole slice of pieces at
  // once (run_update counts them against its copy budget beside the widened gradients).
  virtual int64_t widened_state_bytes(const PieceGeometry& /*piece*/) const { return 0; }

  // What the run's opening line calls it ("AdamW", "AdamW (bf16 moments)", ...).
  virtual std::string describe() const = 0;
};

// The rule of optimizer.name (all but Muon's matrices), with its settings.
std::unique_ptr<UpdateRule> make_update_rule(const recipe::OptimizerConfig& config);

// Runs a rule over pieces in slices whose fp32 gradient copies stay near `copy_budget_bytes`
// (gradients that are not fp32 are widened a slice at a time; results do not depend on the budget).
// Blockwise rules take two passes: maxima over all slices, `reduce_maxima` (the cross-rank maximum;
// may be null when no block is shared), then the updates.
void run_update(UpdateRule& rule, const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
                int64_t copy_budget_bytes,
                const std::function<void(std::vector<at::Tensor>& maxima)>& reduce_maxima);

}  // namespace trainer::optim
