#pragma once
// The comparison of the fp64 test workers: throws naming `what` and the largest difference when
// the shapes differ or the values are not close (at::allclose with `rtol`, `atol`).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace trainer::test {

inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double rtol,
                         double atol) {
  if (!actual.sizes().equals(expected.sizes()) || !at::allclose(actual, expected, rtol, atol))
    throw std::runtime_error(fmt::format("{}: max difference {}", what,
                                         actual.sizes().equals(expected.sizes())
                                             ? (actual - expected).abs().max().item<double>()
                                             : -1.0));
}

}  // namespace trainer::test
