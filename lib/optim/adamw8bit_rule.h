#pragma once
// 8-bit AdamW (Dettmers et al., "8-bit Optimizers via Block-wise Quantization"): both moments are
// stored as one byte per element, the index into the dynamic code (dynamic_code.h; signed for the
// first moment, unsigned for the second), times an fp32 absolute maximum per block of 256 elements
// (block_grid.h: blocks of the parameter, the same on every mesh). Each step dequantises, updates
// the moments and the weights in fp32 (PyTorch's AdamW formulation) and quantises the new moments
// by their new block maxima. Parameters of one dimension (norms, biases) and those with fewer than
// optimizer.min_8bit_size elements keep fp32 moments, as bitsandbytes does.
//
// Every step is written as separate element-wise operations, each rounded once (no fused
// multiply-add whose use could depend on where a slice starts), so an element's update, its codes
// and its block's maximum are bit-identical however a mesh cuts the parameter.
#include "optim/dynamic_code.h"
#include "optim/update_rule.h"

namespace trainer::optim {

class AdamW8bitRule final : public UpdateRule {
 public:
  explicit AdamW8bitRule(const recipe::OptimizerConfig& config) : config_(config) {}
  // Whether a piece of this parameter has quantised moments.
  bool quantized(const PieceGeometry& piece) const {
    return piece.dims >= 2 && piece.global_numel >= config_.min_8bit_size;
  }
  std::vector<StateSpec> state_specs(const PieceGeometry& piece) const override;
  bool blockwise() const override { return true; }
  std::vector<at::Tensor> block_maxima(const std::vector<Piece>& pieces) const override;
  void update(const std::vector<Piece>& pieces, double lr, double weight_decay, int64_t step,
              const std::vector<at::Tensor>& maxima) override;
  std::string describe() const override { return "8-bit AdamW"; }
  // Elements dequantised at once: a piece is worked through in runs of about this many elements
  // that begin at block boundaries (fp32 moments, block indices and temporaries: about 40 bytes
  // each, 160 MB at most), so no run cuts a block of its own piece. Results do not depend on it.
  static constexpr int64_t kRunElements = int64_t(1) << 22;
  void set_run_elements(int64_t n) { run_elements_ = n; }

 private:
  struct Moments {
    at::Tensor m, v;       // fp32, the updated moments of the piece ([blocks, 256] for whole blocks)
    at::Tensor block_ids;  // int64 [length]: each element's block, counted from the piece's first;
                           // undefined for a piece of whole flat blocks (moments [blocks, 256])
  };
  // The piece's moments after this step's gradient (nothing stored).
  Moments new_moments(const Piece& piece) const;
  // A quantised piece cut into runs at block boundaries: each run's piece (views of the piece's
  // tensors, its own geometry) and its first block's index among the piece's blocks.
  struct Run {
    Piece piece;
    PieceGeometry geometry;
    std::vector<at::Tensor> state;
    int64_t first_block = 0, blocks = 0;
  };
  std::vector<Run> runs(const Piece& piece) const;
  int64_t run_elements_ = kRunElements;
  const QuantizationCode& code(bool is_signed, const at::Tensor& like) const;

  recipe::OptimizerConfig config_;
  mutable QuantizationCode signed_, unsigned_;  // made on the device of the first piece
};

}  // namespace trainer::optim
