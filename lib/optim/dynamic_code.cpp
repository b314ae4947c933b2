#include "optim/dynamic_code.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace trainer::optim {

at::Tensor dynamic_code(bool is_signed) {
  // Decade d (0..6) covers [1e-6, 1) x 10^d with 2^d fractions (signed: each also negated) or
  // 2^(d+1) (unsigned): the midpoints of a linear grid from 0.1 to 1. 2 x 127 or 254 values, then
  // 0 and 1 make 256.
  std::vector<double> values;
  for (int d = 0; d < 7; ++d) {
    const int fractions = is_signed ? (1 << d) : (1 << (d + 1));
    const double decade = std::pow(10.0, d - 6);
    for (int k = 0; k < fractions; ++k) {
      const double lo = 0.1 + 0.9 * k / fractions, hi = 0.1 + 0.9 * (k + 1) / fractions;
      const double v = decade * (lo + hi) / 2;
      values.push_back(v);
      if (is_signed) values.push_back(-v);
    }
  }
  values.push_back(0.0);
  values.push_back(1.0);
  std::sort(values.begin(), values.end());
  return at::tensor(values, at::kDouble).to(at::kFloat);
}

QuantizationCode QuantizationCode::make(bool is_signed, const at::TensorOptions& options) {
  const at::Tensor values = dynamic_code(is_signed);
  // Midpoints in double, then rounded: a value exactly between two codes goes to the upper one.
  const at::Tensor wide = values.to(at::kDouble);
  const at::Tensor midpoints = ((wide.narrow(0, 0, 255) + wide.narrow(0, 1, 255)) / 2).to(at::kFloat);
  return {values.to(options.dtype(at::kFloat)), midpoints.to(options.dtype(at::kFloat))};
}

at::Tensor quantize(const QuantizationCode& code, const at::Tensor& normalized) {
  // right=true: the count of midpoints <= x, so a tie lands on the upper value.
  return at::bucketize(normalized, code.midpoints, /*out_int32=*/true, /*right=*/true).to(at::kByte);
}

at::Tensor dequantize(const QuantizationCode& code, const at::Tensor& codes) {
  return code.values.index_select(0, codes.reshape({-1}).to(at::kLong)).view(codes.sizes());
}

}  // namespace trainer::optim
