#pragma once
// The 8-bit dynamic code of 8-bit AdamW (Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization"): 256 values in [-1, 1] (signed, for the first moment) or [0, 1] (unsigned, for the
// second) whose spacing is relative, like a float's: seven decades from 1e-6 to 1, each split
// into linearly spaced fractions, plus 0 and 1. A block's values divided by its absolute maximum
// are stored as the index of the nearest code value. A linear code would round every value below
// 1/127 of the block's maximum to zero; second moments span several decades within a block, and a
// zero there divides the update by eps alone.
#include <ATen/core/Tensor.h>

namespace trainer::optim {

// The 256 code values, ascending, fp32 on the CPU.
at::Tensor dynamic_code(bool is_signed);

// A code ready for a device: its values and the midpoints between neighbours (ascending), so that
// the nearest value's index is the number of midpoints below a normalised value.
struct QuantizationCode {
  at::Tensor values;     // [256] fp32
  at::Tensor midpoints;  // [255] fp32
  static QuantizationCode make(bool is_signed, const at::TensorOptions& options);
};

// Indices (uint8) of the nearest code values of `normalized` (values in [-1, 1]; ties go up).
at::Tensor quantize(const QuantizationCode& code, const at::Tensor& normalized);
// The code values of `codes` (uint8) as fp32.
at::Tensor dequantize(const QuantizationCode& code, const at::Tensor& codes);

}  // namespace trainer::optim
